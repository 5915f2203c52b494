//! Scripts, versions, deployments, targets and memory.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use edgeprof_proto::rest;

use super::error::{ApiError, ApiResult};
use super::extract::{Authorized, Json, Path, Query, RawBody};
use super::{AppState, unsigned};
use crate::fleet::TargetQuery;
use crate::names::ScriptName;
use crate::store::{ScriptVersion, VersionDeletion};
use crate::text::echo;

/// Shortest accepted version-id prefix.
pub const MIN_VERSION_PREFIX: usize = 8;

/// The script of the path, which must exist in the account.
pub async fn require_script(
    state: &AppState,
    auth: &Authorized,
    script: &str,
) -> ApiResult<ScriptName> {
    let script = ScriptName::parse("script", script)?;
    if !state.store.script_exists(&auth.account, &script).await? {
        return Err(ApiError::not_found(
            "unknown_script",
            format!("script `{script}` not found in account `{}`", auth.account),
        ));
    }
    Ok(script)
}

/// Resolves `latest` (the newest deployed version, else the newest), a full
/// id, or a unique prefix of at least 8 characters.
pub async fn resolve_version(
    state: &AppState,
    account: &str,
    script: &str,
    selector: &str,
) -> ApiResult<ScriptVersion> {
    if selector == "latest" {
        let deployed = state.store.deployment(account, script).await?;
        let versions = state.store.versions(account, script).await?;
        let newest_deployed = versions.iter().find(|v| {
            deployed
                .iter()
                .any(|d| d.version_id == v.id && d.weight > 0)
        });
        return newest_deployed
            .or(versions.first())
            .cloned()
            .ok_or_else(|| {
                ApiError::not_found(
                    "unknown_version",
                    format!("script `{script}` has no versions yet"),
                )
            });
    }
    let lower = selector.to_ascii_lowercase();
    if !lower.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        || lower.is_empty()
        || lower.len() > 36
    {
        return Err(ApiError::bad_request(
            "invalid_version",
            format!(
                "version: `{}` is not `latest`, a version id or a prefix of one",
                echo(selector)
            ),
        ));
    }
    if lower.len() < MIN_VERSION_PREFIX {
        return Err(ApiError::bad_request(
            "invalid_version",
            format!(
                "version: prefix `{selector}` is too short; give at least {MIN_VERSION_PREFIX} characters"
            ),
        ));
    }
    let mut matches = state
        .store
        .versions_with_prefix(account, script, &lower)
        .await?;
    match matches.len() {
        0 => Err(ApiError::not_found(
            "unknown_version",
            format!("version `{selector}` of script `{script}` not found"),
        )),
        1 => Ok(matches.remove(0)),
        n => Err(ApiError::new(
            StatusCode::CONFLICT,
            "ambiguous_version",
            format!(
                "version: prefix `{selector}` matches {n} versions of `{script}` ({}); give more characters",
                matches
                    .iter()
                    .take(5)
                    .map(|v| v.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// `GET /scripts`.
pub async fn list_scripts(
    auth: Authorized,
    State(state): State<AppState>,
) -> ApiResult<axum::Json<rest::ScriptList>> {
    let scripts = state.store.scripts(&auth.account).await?;
    Ok(axum::Json(rest::ScriptList {
        scripts: scripts
            .into_iter()
            .map(|s| rest::ScriptSummary {
                name: s.name,
                created_at_ms: s.created_at_ms,
                versions: unsigned(s.versions),
            })
            .collect(),
    }))
}

/// `GET /scripts/{script}/versions`.
pub async fn list_versions(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
) -> ApiResult<axum::Json<rest::VersionList>> {
    let script = require_script(&state, &auth, &script).await?;
    let versions = state.store.versions(&auth.account, &script).await?;
    let deployment = state.store.deployment(&auth.account, &script).await?;
    let versions = versions
        .into_iter()
        .map(|v| rest::VersionInfo {
            weight: deployment
                .iter()
                .find(|d| d.version_id == v.id)
                .map_or(0, |d| d.weight),
            id: v.id,
            seq: unsigned(v.seq),
            created_at_ms: v.created_at_ms,
            wasm_sha256: v.wasm_sha256,
            wasm_bytes: unsigned(v.wasm_bytes),
        })
        .collect();
    Ok(axum::Json(rest::VersionList {
        script: script.to_string(),
        versions,
        deployment,
    }))
}

/// `POST /scripts/{script}/versions[?weight=N]`, the wasm as the body.
pub async fn upload_version(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
    Query(q): Query<rest::UploadQuery>,
    RawBody(body): RawBody,
) -> ApiResult<Response> {
    let script = ScriptName::parse_new("script", &script)?;
    if let Some(w) = q.weight.filter(|w| *w > 100) {
        return Err(ApiError::bad_request(
            "invalid_weight",
            format!("weight: must be a whole number from 0 to 100 (got {w})"),
        ));
    }
    if !body.starts_with(b"\0asm") {
        return Err(ApiError::bad_request(
            "invalid_wasm",
            format!(
                "body: not a WebAssembly module (no \\0asm header; {} bytes)",
                body.len()
            ),
        ));
    }
    let (version, deployment) = state
        .store
        .add_version(&auth.account, &script, &body, q.weight)
        .await?;
    tracing::info!(account = %auth.account, script = %script, version = %version.id, "version uploaded");
    let out = rest::UploadedVersion {
        id: version.id,
        script: script.to_string(),
        seq: unsigned(version.seq),
        created_at_ms: version.created_at_ms,
        wasm_sha256: version.wasm_sha256,
        wasm_bytes: unsigned(version.wasm_bytes),
        deployment,
    };
    Ok((StatusCode::CREATED, axum::Json(out)).into_response())
}

/// `DELETE /scripts/{script}/versions/{version}`: refused while deployed.
pub async fn delete_version(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script, selector)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let script = require_script(&state, &auth, &script).await?;
    let version = resolve_version(&state, &auth.account, &script, &selector).await?;
    match state
        .store
        .delete_version(&auth.account, &script, &version.id)
        .await?
    {
        VersionDeletion::Deleted => Ok(StatusCode::NO_CONTENT),
        VersionDeletion::NotFound => Err(ApiError::not_found(
            "unknown_version",
            format!("version `{}` of script `{script}` not found", version.id),
        )),
        VersionDeletion::Deployed(weight) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "version_deployed",
            format!(
                "version {} of `{script}` has weight {weight} in the deployment; \
                 give it weight 0 (PUT …/deployment) before deleting it",
                version.id
            ),
        )),
    }
}

/// `GET /scripts/{script}/deployment`.
pub async fn get_deployment(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
) -> ApiResult<axum::Json<rest::Deployment>> {
    let script = require_script(&state, &auth, &script).await?;
    let versions = state.store.deployment(&auth.account, &script).await?;
    Ok(axum::Json(rest::Deployment {
        script: script.to_string(),
        versions,
    }))
}

/// `PUT /scripts/{script}/deployment`.
pub async fn put_deployment(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
    Json(body): Json<rest::DeploymentRequest>,
) -> ApiResult<axum::Json<rest::Deployment>> {
    let script = require_script(&state, &auth, &script).await?;
    // Each entry names its version as any selector does (`latest`, an id,
    // a unique prefix); what is stored is the resolved id.
    let mut resolved: Vec<rest::DeploymentEntry> = Vec::with_capacity(body.versions.len());
    for (i, e) in body.versions.iter().enumerate() {
        let version = resolve_version(&state, &auth.account, &script, &e.version_id)
            .await
            .map_err(|err| err.in_field(&format!("versions[{i}].version_id")))?;
        if resolved.iter().any(|r| r.version_id == version.id) {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("versions[{i}].version_id: `{}` listed twice", version.id),
            ));
        }
        if e.weight > 100 {
            return Err(ApiError::bad_request(
                "invalid_weight",
                format!("versions[{i}].weight: at most 100 (got {})", e.weight),
            ));
        }
        resolved.push(rest::DeploymentEntry {
            version_id: version.id,
            weight: e.weight,
        });
    }
    let entries: Vec<_> = resolved.into_iter().filter(|e| e.weight > 0).collect();
    state
        .store
        .set_deployment(&auth.account, &script, &entries)
        .await?;
    Ok(axum::Json(rest::Deployment {
        script: script.to_string(),
        versions: entries,
    }))
}

/// `GET /scripts/{script}/targets`.
pub async fn targets(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
    Query(q): Query<rest::TargetsQuery>,
) -> ApiResult<axum::Json<rest::TargetList>> {
    let script = require_script(&state, &auth, &script).await?;
    let version = match &q.version {
        Some(sel) => Some(resolve_version(&state, &auth.account, &script, sel).await?),
        None => None,
    };
    state.fleet_now().await?;
    let targets = state.fleet.targets(&TargetQuery {
        account: &auth.account,
        script: &script,
        version_id: version.as_ref().map(|v| v.id.as_str()),
        data_center: q.data_center.as_deref(),
        durable_object: None,
    });
    Ok(axum::Json(rest::TargetList {
        script: script.to_string(),
        version_id: version.map(|v| v.id),
        targets,
    }))
}

/// `window_s` as a duration: 1 to the window kept.
fn window(raw: Option<u64>) -> ApiResult<Duration> {
    let max = crate::fleet::MEMORY_WINDOW.as_secs();
    match raw {
        None => Ok(crate::fleet::MEMORY_WINDOW),
        Some(n) if (1..=max).contains(&n) => Ok(Duration::from_secs(n)),
        Some(n) => Err(ApiError::bad_request(
            "invalid_window",
            format!("window_s: must be a whole number of seconds from 1 to {max} (got {n})"),
        )),
    }
}

/// `GET /scripts/{script}/memory`.
pub async fn memory(
    auth: Authorized,
    State(state): State<AppState>,
    Path((_, script)): Path<(String, String)>,
    Query(q): Query<rest::MemoryQuery>,
) -> ApiResult<axum::Json<rest::MemoryReport>> {
    let script = require_script(&state, &auth, &script).await?;
    let window = window(q.window_s)?;
    state.fleet_now().await?;
    let account = &auth.account;
    let versions = match &q.version {
        // The asked version, even with nothing reported yet.
        Some(sel) => {
            let v = resolve_version(&state, account, &script, sel).await?;
            vec![state.fleet.memory(account, &script, &v.id, window)]
        }
        // Every version something is known about, newest first.
        None => state
            .store
            .versions(account, &script)
            .await?
            .iter()
            .map(|v| state.fleet.memory(account, &script, &v.id, window))
            .filter(crate::fleet::has_data)
            .collect(),
    };
    Ok(axum::Json(rest::MemoryReport {
        script: script.to_string(),
        versions,
    }))
}
