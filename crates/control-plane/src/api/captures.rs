//! Capture requests: `POST /scripts/{script}/versions/{version}/profile`
//! (synchronous, Cloudflare's body, answers the gzip'd pprof) and
//! `POST /profiles` (asynchronous, answers 202 with the session).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use edgeprof_proto::rest::{
    self, CaptureRequest, DEFAULT_DURATION_MS, MAX_DURATION_MS, MIN_DURATION_MS, ProfileKind,
    SessionStatus,
};

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::extract::{Authorized, Json, Path};
use super::scripts::{require_script, resolve_version};
use super::sessions::{failures, missing_machines};
use crate::capture::{BusyReason, CaptureSpec, StartError};
use crate::fleet::TargetQuery;
use crate::names::{DurableObjectId, ScriptName};
use crate::store::StoreError;
use crate::text::echo;

/// A capture body, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureBody {
    /// `script` (asynchronous form only).
    pub script: Option<ScriptName>,
    /// `version` (asynchronous form only; default `latest`).
    pub version: Option<String>,
    /// Kind.
    pub kind: ProfileKind,
    /// Duration.
    pub duration: Duration,
    /// The Durable Object.
    pub durable_object: Option<DurableObjectId>,
    /// Data-center filter.
    pub data_center: Option<String>,
}

/// Checks a capture request (`async_form`: `script`/`version` belong in
/// the body, else in the URL).
pub fn validate(body: CaptureRequest, async_form: bool) -> ApiResult<CaptureBody> {
    let duration_ms = body.duration_ms.unwrap_or(DEFAULT_DURATION_MS);
    if !(MIN_DURATION_MS..=MAX_DURATION_MS).contains(&duration_ms) {
        return Err(ApiError::bad_request(
            "invalid_duration",
            format!(
                "duration_ms: must be between {MIN_DURATION_MS} and {MAX_DURATION_MS} (1–50 s), got {duration_ms}"
            ),
        ));
    }
    let durable_object = match (&body.namespace_id, &body.actor_id) {
        (None, None) => None,
        (Some(ns), Some(id)) => Some(DurableObjectId::parse("namespace_id", ns, "actor_id", id)?),
        (Some(_), None) => {
            return Err(ApiError::bad_request(
                "invalid_durable_object",
                "actor_id: required with namespace_id (a Durable Object is namespace + 64-hex id)",
            ));
        }
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "invalid_durable_object",
                "namespace_id: required with actor_id (a Durable Object is namespace + 64-hex id)",
            ));
        }
    };
    if let Some(dc) = &body.data_center {
        if dc.is_empty()
            || dc.len() > 16
            || !dc
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(ApiError::bad_request(
                "invalid_data_center",
                format!(
                    "data_center: `{}` must be 1–16 lowercase letters or digits (e.g. `lhr`)",
                    echo(dc)
                ),
            ));
        }
        if durable_object.is_some() {
            return Err(ApiError::bad_request(
                "invalid_data_center",
                "data_center: cannot be combined with a Durable Object, which lives in one place",
            ));
        }
    }
    let (script, version) = if async_form {
        let script = body
            .script
            .as_deref()
            .ok_or_else(|| ApiError::bad_request("invalid_body", "script: required"))?;
        let script = ScriptName::parse("script", script)?;
        (
            Some(script),
            Some(body.version.unwrap_or_else(|| "latest".into())),
        )
    } else {
        for (f, given) in [
            ("script", body.script.is_some()),
            ("version", body.version.is_some()),
        ] {
            if given {
                return Err(ApiError::bad_request(
                    "invalid_body",
                    format!("{f}: given in the URL of this endpoint, not in the body"),
                ));
            }
        }
        (None, None)
    };
    Ok(CaptureBody {
        script,
        version,
        kind: body.profile_type.unwrap_or_default(),
        duration: Duration::from_millis(duration_ms),
        durable_object,
        data_center: body.data_center,
    })
}

async fn prepare_capture(
    state: &AppState,
    auth: &Authorized,
    script: &str,
    selector: &str,
    body: CaptureBody,
) -> ApiResult<CaptureSpec> {
    let script = require_script(state, auth, script).await?;
    let version = resolve_version(state, &auth.account, &script, selector).await?;
    let durable_object = body.durable_object.as_ref().map(ToString::to_string);
    state.fleet_now().await?;
    let targets = state.fleet.targets(&TargetQuery {
        account: &auth.account,
        script: &script,
        version_id: Some(&version.id),
        data_center: body.data_center.as_deref(),
        durable_object: durable_object.as_deref(),
    });
    if targets.is_empty() {
        let message = match (&durable_object, &body.data_center) {
            (Some(d), _) => format!(
                "no recent executions were found for durable object {d} on version {} of `{script}`",
                version.id
            ),
            (None, Some(dc)) => format!(
                "no recent executions were found for version {} of `{script}` in data center `{dc}`",
                version.id
            ),
            (None, None) => format!(
                "no recent executions were found for version {} of `{script}`",
                version.id
            ),
        };
        return Err(ApiError::not_found("no_recent_executions", message));
    }
    Ok(CaptureSpec {
        account: auth.account.clone(),
        script,
        version_id: version.id,
        version_selector: selector.to_owned(),
        kind: body.kind,
        duration: body.duration,
        data_center: body.data_center,
        durable_object: body.durable_object,
        targets,
    })
}

fn start_error(e: StartError) -> ApiError {
    match e {
        StartError::Busy(b) => {
            let message = match &b.reason {
                BusyReason::Limit => format!(
                    "{} captures of this script are already running (the limit); retry in {} s",
                    b.running, b.retry_after_secs
                ),
                BusyReason::Overlap(isolates) => format!(
                    "a running capture already profiles {} of these isolates ({}); an isolate is profiled by one capture at a time; retry in {} s",
                    isolates.len(),
                    crate::text::truncate(&isolates.join(", "), 512),
                    b.retry_after_secs
                ),
            };
            ApiError {
                retry_after: Some(b.retry_after_secs),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_captures", message)
            }
        }
        StartError::Store(e) => e.into(),
    }
}

/// `POST /scripts/{script}/versions/{version}/profile`.
pub async fn profile_sync(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script, version)): Path<(String, String, String)>,
    Json(body): Json<CaptureRequest>,
) -> ApiResult<Response> {
    let parsed = validate(body, false)?;
    let spec = prepare_capture(&state, &auth, &script, &version, parsed).await?;
    let session = state.captures.start(spec).await.map_err(start_error)?;
    state.captures.wait(&session.id).await;
    let row = state
        .store
        .session(&auth.account, &session.id)
        .await?
        .ok_or_else(|| ApiError::from(StoreError::Corrupt("session vanished".into())))?;
    if row.status == SessionStatus::Failed {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "capture_failed",
            format!(
                "capture {} failed: {}",
                row.id,
                row.error.as_deref().unwrap_or("no reason recorded")
            ),
        ));
    }
    let bytes = state.store.profile(&row.id).await?.ok_or_else(|| {
        ApiError::from(StoreError::Corrupt(format!(
            "session {} has no profile",
            row.id
        )))
    })?;
    let mut resp = ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&row.id) {
        h.insert(rest::SESSION_HEADER, v);
    }
    h.insert(
        rest::STATUS_HEADER,
        HeaderValue::from_static(row.status.as_str()),
    );
    let missing = missing_machines(&failures(&row));
    if !missing.is_empty()
        && let Ok(v) = HeaderValue::from_str(&crate::text::truncate(&missing.join(","), 4096))
    {
        h.insert(rest::MISSING_MACHINES_HEADER, v);
    }
    Ok(resp)
}

/// `POST /profiles`.
pub async fn start_session(
    auth: Authorized,
    State(state): State<AppState>,
    Json(body): Json<CaptureRequest>,
) -> ApiResult<Response> {
    let parsed = validate(body, true)?;
    let script = parsed
        .script
        .clone()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let version = parsed.version.clone().unwrap_or_else(|| "latest".into());
    let spec = prepare_capture(&state, &auth, &script, &version, parsed).await?;
    let session = state.captures.start(spec).await.map_err(start_error)?;
    let started = rest::SessionStarted {
        id: session.id,
        status: session.status,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(started)).into_response())
}
