//! Capture sessions and their profiles; the account's own API tokens.

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use edgeprof_proto::rest::{self, DEFAULT_SESSIONS_LIMIT, MAX_SESSIONS_LIMIT, SessionStatus};

use super::error::{ApiError, ApiResult};
use super::extract::{Authorized, Query};
use super::{AppState, unsigned};
use crate::names::ScriptName;
use crate::store::{SessionRow, TOKEN_ID_LEN};
use crate::text::echo;

/// The failures a session recorded.
pub fn failures(row: &SessionRow) -> Vec<rest::Failure> {
    serde_json::from_str(&row.failures_json).unwrap_or_default()
}

/// The machines of `failures`, sorted, once each.
pub fn missing_machines(failures: &[rest::Failure]) -> Vec<String> {
    let mut names: Vec<String> = failures.iter().map(|f| f.machine.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn session(row: &SessionRow, failures: &[rest::Failure]) -> rest::Session {
    rest::Session {
        id: row.id.clone(),
        script: row.script.clone(),
        version_id: row.version_id.clone(),
        version: row.version_selector.clone(),
        profile_type: row.kind,
        duration_ms: unsigned(row.duration_ms),
        data_center: row.data_center.clone(),
        durable_object: row.durable_object.clone(),
        status: row.status,
        error: row.error.clone(),
        created_at_ms: row.created_at_ms,
        updated_at_ms: row.updated_at_ms,
        progress: rest::Progress {
            machines_total: unsigned(row.machines_total),
            machines_answered: unsigned(row.machines_answered),
        },
        missing_machines: missing_machines(failures),
        requests: row.requests.map(unsigned),
    }
}

/// `GET /profiles[?script=S][&limit=N]`.
pub async fn list_sessions(
    auth: Authorized,
    State(state): State<AppState>,
    Query(q): Query<rest::SessionsQuery>,
) -> ApiResult<axum::Json<rest::SessionList>> {
    let limit = q.limit.unwrap_or(DEFAULT_SESSIONS_LIMIT);
    if !(1..=MAX_SESSIONS_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_limit",
            format!("limit: must be a whole number from 1 to {MAX_SESSIONS_LIMIT} (got {limit})"),
        ));
    }
    let script = q
        .script
        .as_deref()
        .map(|s| ScriptName::parse("script", s))
        .transpose()?;
    let rows = state
        .store
        .sessions(&auth.account, script.as_deref(), i64::from(limit))
        .await?;
    Ok(axum::Json(rest::SessionList {
        profiles: rows.iter().map(|r| session(r, &failures(r))).collect(),
    }))
}

async fn find_session(state: &AppState, auth: &Authorized, id: &str) -> ApiResult<SessionRow> {
    state
        .store
        .session(&auth.account, id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                "unknown_session",
                format!(
                    "profile session `{}` not found in account `{}`",
                    echo(id),
                    auth.account
                ),
            )
        })
}

/// `GET /profiles/{id}`.
pub async fn get_session(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, id)): Path<(String, String)>,
) -> ApiResult<axum::Json<rest::SessionDetail>> {
    let row = find_session(&state, &auth, &id).await?;
    let failures = failures(&row);
    let events = state
        .store
        .session_events(&row.id)
        .await?
        .into_iter()
        .map(|e| rest::SessionEvent {
            status: e.status,
            at_ms: e.at_ms,
            detail: e.detail,
        })
        .collect();
    Ok(axum::Json(rest::SessionDetail {
        session: session(&row, &failures),
        targets: serde_json::from_str(&row.targets_json).unwrap_or_default(),
        failures,
        events,
    }))
}

/// `GET /profiles/{id}/pprof`.
pub async fn get_session_pprof(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let row = find_session(&state, &auth, &id).await?;
    match state.store.profile(&row.id).await? {
        Some(bytes) => Ok((
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{}.pprof\"", row.id),
                ),
            ],
            bytes,
        )
            .into_response()),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "profile_not_ready",
            match row.status {
                SessionStatus::Failed => format!(
                    "session `{}` failed and has no profile: {}",
                    row.id,
                    row.error.as_deref().unwrap_or("no reason recorded")
                ),
                s => format!(
                    "session `{}` is still {s}; its profile is not ready",
                    row.id
                ),
            },
        )),
    }
}

/// `GET /tokens`.
pub async fn list_tokens(
    auth: Authorized,
    State(state): State<AppState>,
) -> ApiResult<axum::Json<rest::TokenList>> {
    let tokens = state.store.tokens(Some(&auth.account)).await?;
    Ok(axum::Json(rest::TokenList {
        tokens: tokens
            .into_iter()
            .map(|t| rest::TokenInfo {
                current: t.id == auth.token_id,
                id: t.id,
                created_at_ms: t.created_at_ms,
            })
            .collect(),
    }))
}

/// `DELETE /tokens/{id}`.
pub async fn revoke_token(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    if id.len() != TOKEN_ID_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "invalid_token_id",
            format!(
                "id: `{}` must be the {TOKEN_ID_LEN} hex characters `GET …/tokens` lists",
                echo(&id)
            ),
        ));
    }
    if state.store.revoke_token(Some(&auth.account), &id).await? {
        tracing::info!(account = %auth.account, token = %id, "token revoked");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(
            "unknown_token",
            format!("no token `{id}` in account `{}`", auth.account),
        ))
    }
}
