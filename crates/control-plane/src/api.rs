//! The REST API (DESIGN.md §5): one router built by [`app`], one error type
//! ([`ApiError`]) rendered as `{"error": {"code", "message"}}`, bearer-token
//! auth scoped to one account.
//!
//! Endpoints under `/v1/accounts/{account}`:
//! - `GET /scripts`; `GET /scripts/{script}/versions`;
//!   `POST /scripts/{script}/versions[?weight=N]` with the wasm bytes as the
//!   body (creates the script; without `weight` the new version takes all
//!   traffic, with `weight` N in 0–100 it takes N % and the versions already
//!   deployed share the rest in proportion); `GET|PUT
//!   /scripts/{script}/deployment` (`{"versions": [{"version_id",
//!   "weight"}]}`; on PUT each `version_id` may be any version selector,
//!   stored resolved); `GET /scripts/{script}/targets[?version=SEL]`.
//! - `GET /scripts/{script}/memory[?version=SEL][&window_s=N]`: per version,
//!   its isolates' memory now, nearest-rank p50/p99/p99.9/max of the
//!   heartbeat readings in the last N s (1–300, default 300) and the
//!   eviction counters (see [`crate::fleet::Fleet::memory`]).
//! - `POST /scripts/{script}/versions/{version}/profile` (Cloudflare's body)
//!   → 200 gzip'd pprof, synchronously. A partial capture still answers 200,
//!   with `X-Edgeprof-Status: partial` and `X-Edgeprof-Missing-Machines`.
//! - `POST /profiles` → 202 `{"id", "status"}`; `GET /profiles[?script=S]`;
//!   `GET /profiles/{id}`; `GET /profiles/{id}/pprof`.
//!
//! And `/healthz`, `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::capture::{BusyReason, CaptureSpec, Captures, Failure, ProfileKind, StartError};
use crate::fleet::{Fleet, Target, TargetQuery};
use crate::metrics::Metrics;
use crate::store::{DeploymentEntry, ScriptVersion, SessionRow, Store, StoreError};

/// Shortest and longest capture, and the default.
pub const MIN_DURATION_MS: u64 = 1_000;
/// Longest capture.
pub const MAX_DURATION_MS: u64 = 50_000;
/// Capture duration when none is given.
pub const DEFAULT_DURATION_MS: u64 = 10_000;
/// Shortest accepted version-id prefix.
pub const MIN_VERSION_PREFIX: usize = 8;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Database.
    pub store: Arc<Store>,
    /// Live machines.
    pub fleet: Arc<Fleet>,
    /// Capture runner.
    pub captures: Captures,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Largest accepted wasm upload.
    pub max_wasm_bytes: usize,
}

/// An HTTP error: status, machine-readable code, human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `invalid_duration`.
    pub code: &'static str,
    /// What was wrong, naming the field and limit.
    pub message: String,
    /// `Retry-After` seconds, for 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with a code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 with a code.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// The same error, about `field` of a request body (a leading
    /// `version: ` of the selector's own message is replaced by it).
    fn in_field(mut self, field: &str) -> Self {
        let rest = self
            .message
            .strip_prefix("version: ")
            .unwrap_or(&self.message);
        self.message = format!("{field}: {rest}");
        self
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!("storage: {e:#}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the control plane's log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        let mut resp = (self.status, body).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The router over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.max_wasm_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/accounts/{account}/scripts", get(list_scripts))
        .route(
            "/v1/accounts/{account}/scripts/{script}/versions",
            get(list_versions).post(upload_version),
        )
        .route(
            "/v1/accounts/{account}/scripts/{script}/deployment",
            get(get_deployment).put(put_deployment),
        )
        .route(
            "/v1/accounts/{account}/scripts/{script}/targets",
            get(targets),
        )
        .route(
            "/v1/accounts/{account}/scripts/{script}/memory",
            get(memory),
        )
        .route(
            "/v1/accounts/{account}/scripts/{script}/versions/{version}/profile",
            post(profile_sync),
        )
        .route(
            "/v1/accounts/{account}/profiles",
            get(list_sessions).post(start_session),
        )
        .route("/v1/accounts/{account}/profiles/{id}", get(get_session))
        .route(
            "/v1/accounts/{account}/profiles/{id}/pprof",
            get(get_session_pprof),
        )
        .fallback(|| async {
            ApiError::not_found("not_found", "no such endpoint; see DESIGN.md §5")
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .with_state(state)
}

async fn count_responses(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    let s = resp.status();
    if s.is_server_error() {
        state.metrics.http_server_errors.inc();
    } else if s.is_client_error() {
        state.metrics.http_client_errors.inc();
    } else {
        state.metrics.http_ok.inc();
    }
    resp
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => "ok\n".into_response(),
        Err(e) => {
            tracing::error!("healthz: {e:#}");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state
        .metrics
        .render(state.fleet.live_machines().len(), state.captures.running());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

// ---- validation ----

fn valid_name(field: &str, v: &str) -> ApiResult<()> {
    if v.is_empty()
        || v.len() > 64
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ApiError::bad_request(
            "invalid_name",
            format!("{field}: `{v}` must be 1–64 characters of A–Z, a–z, 0–9, `-`, `_`"),
        ));
    }
    Ok(())
}

/// Checks a Durable Object's namespace and id.
pub fn validate_durable_object(namespace: &str, id: &str) -> ApiResult<()> {
    if namespace.is_empty()
        || namespace.len() > 64
        || !namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ApiError::bad_request(
            "invalid_durable_object",
            format!(
                "namespace_id: `{namespace}` must be 1–64 characters of A–Z, a–z, 0–9, `-`, `_`"
            ),
        ));
    }
    if id.len() != 64 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "invalid_durable_object",
            format!(
                "actor_id: must be 64 hexadecimal characters (got {} characters: `{}`)",
                id.chars().count(),
                id.chars().take(80).collect::<String>()
            ),
        ));
    }
    Ok(())
}

/// The body of a capture request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileBody {
    /// `script` (async form only).
    pub script: Option<String>,
    /// `version` (async form only; default `latest`).
    pub version: Option<String>,
    /// Kind.
    pub kind: ProfileKind,
    /// Duration.
    pub duration: Duration,
    /// `namespace:id`.
    pub durable_object: Option<String>,
    /// Data-center filter.
    pub data_center: Option<String>,
}

fn opt_str<'a>(
    body: &'a serde_json::Map<String, Value>,
    field: &str,
) -> ApiResult<Option<&'a str>> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::bad_request(
            "invalid_body",
            format!("{field}: must be a string (got {other})"),
        )),
    }
}

/// Parses and checks a capture body (`async_form`: `script`/`version` too).
pub fn parse_profile_body(raw: &[u8], async_form: bool) -> ApiResult<ProfileBody> {
    let value: Value = if raw.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(raw).map_err(|e| {
            ApiError::bad_request("invalid_body", format!("body: not valid JSON: {e}"))
        })?
    };
    let Value::Object(body) = value else {
        return Err(ApiError::bad_request(
            "invalid_body",
            "body: must be a JSON object",
        ));
    };
    let known = [
        "duration_ms",
        "profile_type",
        "namespace_id",
        "actor_id",
        "data_center",
        "script",
        "version",
    ];
    if let Some(k) = body.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("{k}: unknown field (known: {})", known.join(", ")),
        ));
    }
    let duration_ms = match body.get("duration_ms") {
        None | Some(Value::Null) => DEFAULT_DURATION_MS,
        Some(v) => v.as_u64().ok_or_else(|| {
            ApiError::bad_request(
                "invalid_duration",
                format!("duration_ms: must be a whole number of milliseconds (got {v})"),
            )
        })?,
    };
    if !(MIN_DURATION_MS..=MAX_DURATION_MS).contains(&duration_ms) {
        return Err(ApiError::bad_request(
            "invalid_duration",
            format!(
                "duration_ms: must be between {MIN_DURATION_MS} and {MAX_DURATION_MS} (1–50 s), got {duration_ms}"
            ),
        ));
    }
    let kind = match opt_str(&body, "profile_type")? {
        None | Some("cpu") => ProfileKind::Cpu,
        Some("heap") => ProfileKind::Heap,
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_profile_type",
                format!("profile_type: unknown profile type `{other}`; expected `cpu` or `heap`"),
            ));
        }
    };
    let durable_object = match (opt_str(&body, "namespace_id")?, opt_str(&body, "actor_id")?) {
        (None, None) => None,
        (Some(ns), Some(id)) => {
            validate_durable_object(ns, id)?;
            Some(format!("{ns}:{}", id.to_ascii_lowercase()))
        }
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
    let data_center = opt_str(&body, "data_center")?.map(str::to_owned);
    if let Some(dc) = &data_center {
        if dc.is_empty()
            || dc.len() > 16
            || !dc
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(ApiError::bad_request(
                "invalid_data_center",
                format!(
                    "data_center: `{dc}` must be 1–16 lowercase letters or digits (e.g. `lhr`)"
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
        let script = opt_str(&body, "script")?
            .ok_or_else(|| ApiError::bad_request("invalid_body", "script: required"))?;
        valid_name("script", script)?;
        let version = opt_str(&body, "version")?.unwrap_or("latest");
        (Some(script.to_owned()), Some(version.to_owned()))
    } else {
        for f in ["script", "version"] {
            if body.contains_key(f) {
                return Err(ApiError::bad_request(
                    "invalid_body",
                    format!("{f}: given in the URL of this endpoint, not in the body"),
                ));
            }
        }
        (None, None)
    };
    Ok(ProfileBody {
        script,
        version,
        kind,
        duration: Duration::from_millis(duration_ms),
        durable_object,
        data_center,
    })
}

// ---- auth and lookups ----

async fn authorize(state: &AppState, headers: &HeaderMap, account: &str) -> ApiResult<()> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "missing `Authorization: Bearer <token>` header",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the Authorization header must be `Bearer <token>`",
            )
        })?;
    match state.store.token_account(token).await? {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "unknown or revoked API token",
        )),
        Some(owner) if owner != account => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token belongs to another account and cannot access account `{account}`"),
        )),
        Some(_) => Ok(()),
    }
}

async fn require_script(state: &AppState, account: &str, script: &str) -> ApiResult<()> {
    valid_name("script", script)?;
    if !state.store.script_exists(account, script).await? {
        return Err(ApiError::not_found(
            "unknown_script",
            format!("script `{script}` not found in account `{account}`"),
        ));
    }
    Ok(())
}

/// Resolves `latest` (the newest deployed version, else the newest), a full
/// id, or a unique prefix of at least 8 characters.
async fn resolve_version(
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
    if !lower.chars().all(|c| c.is_ascii_hexdigit() || c == '-') || lower.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_version",
            format!("version: `{selector}` is not `latest`, a version id or a prefix of one"),
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
                    .map(|v| v.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

// ---- scripts and versions ----

async fn list_scripts(
    State(state): State<AppState>,
    Path(account): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    let scripts = state.store.scripts(&account).await?;
    Ok(Json(json!({ "scripts": scripts })))
}

async fn versions_doc(state: &AppState, account: &str, script: &str) -> ApiResult<Value> {
    let versions = state.store.versions(account, script).await?;
    let deployment = state.store.deployment(account, script).await?;
    let rows: Vec<Value> = versions
        .iter()
        .map(|v| {
            let weight = deployment
                .iter()
                .find(|d| d.version_id == v.id)
                .map_or(0, |d| d.weight);
            json!({
                "id": v.id, "seq": v.seq, "created_at_ms": v.created_at_ms,
                "wasm_sha256": v.wasm_sha256, "wasm_bytes": v.wasm_bytes, "weight": weight,
            })
        })
        .collect();
    Ok(json!({ "script": script, "versions": rows, "deployment": deployment }))
}

async fn list_versions(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    require_script(&state, &account, &script).await?;
    Ok(Json(versions_doc(&state, &account, &script).await?))
}

#[derive(Debug, serde::Deserialize)]
struct UploadQuery {
    weight: Option<String>,
}

async fn upload_version(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    authorize(&state, &headers, &account).await?;
    valid_name("script", &script)?;
    let weight = match q.weight.as_deref() {
        None => None,
        Some(w) => match w.parse::<u32>() {
            Ok(n) if n <= 100 => Some(n),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_weight",
                    format!("weight: must be a whole number from 0 to 100 (got `{w}`)"),
                ));
            }
        },
    };
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
        .add_version(&account, &script, &body, weight)
        .await?;
    tracing::info!(account = %account, script = %script, version = %version.id, "version uploaded");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": version.id, "script": script, "seq": version.seq,
            "created_at_ms": version.created_at_ms, "wasm_sha256": version.wasm_sha256,
            "wasm_bytes": version.wasm_bytes, "deployment": deployment,
        })),
    )
        .into_response())
}

async fn get_deployment(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    require_script(&state, &account, &script).await?;
    let d = state.store.deployment(&account, &script).await?;
    Ok(Json(json!({ "script": script, "versions": d })))
}

async fn put_deployment(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    require_script(&state, &account, &script).await?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        versions: Vec<DeploymentEntry>,
    }
    let body: Body = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("body: expected {{\"versions\": [{{\"version_id\", \"weight\"}}]}}: {e}"),
        )
    })?;
    // Each entry names its version as any selector does (`latest`, an id,
    // a unique prefix); what is stored is the resolved id.
    let mut resolved = Vec::with_capacity(body.versions.len());
    for (i, e) in body.versions.iter().enumerate() {
        let version = resolve_version(&state, &account, &script, &e.version_id)
            .await
            .map_err(|err| err.in_field(&format!("versions[{i}].version_id")))?;
        if resolved
            .iter()
            .any(|r: &DeploymentEntry| r.version_id == version.id)
        {
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
        resolved.push(DeploymentEntry {
            version_id: version.id,
            weight: e.weight,
        });
    }
    let entries: Vec<DeploymentEntry> = resolved.into_iter().filter(|e| e.weight > 0).collect();
    state
        .store
        .set_deployment(&account, &script, &entries)
        .await?;
    Ok(Json(json!({ "script": script, "versions": entries })))
}

#[derive(Debug, serde::Deserialize)]
struct TargetsQuery {
    version: Option<String>,
    data_center: Option<String>,
}

async fn targets(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    Query(q): Query<TargetsQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    require_script(&state, &account, &script).await?;
    let version = match &q.version {
        Some(sel) => Some(resolve_version(&state, &account, &script, sel).await?),
        None => None,
    };
    let targets = state.fleet.targets(&TargetQuery {
        account: &account,
        script: &script,
        version_id: version.as_ref().map(|v| v.id.as_str()),
        data_center: q.data_center.as_deref(),
        durable_object: None,
    });
    Ok(Json(json!({
        "script": script,
        "version_id": version.map(|v| v.id),
        "targets": targets,
    })))
}

#[derive(Debug, serde::Deserialize)]
struct MemoryQuery {
    version: Option<String>,
    window_s: Option<String>,
}

/// `window_s` as a duration: a whole number of seconds, 1 to the window kept.
fn parse_window(raw: Option<&str>) -> ApiResult<Duration> {
    let max = crate::fleet::MEMORY_WINDOW.as_secs();
    match raw {
        None => Ok(crate::fleet::MEMORY_WINDOW),
        Some(w) => match w.trim().parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(Duration::from_secs(n)),
            _ => Err(ApiError::bad_request(
                "invalid_window",
                format!("window_s: must be a whole number of seconds from 1 to {max} (got `{w}`)"),
            )),
        },
    }
}

async fn memory(
    State(state): State<AppState>,
    Path((account, script)): Path<(String, String)>,
    Query(q): Query<MemoryQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    require_script(&state, &account, &script).await?;
    let window = parse_window(q.window_s.as_deref())?;
    let versions = match &q.version {
        // The asked version, even with nothing reported yet.
        Some(sel) => {
            let v = resolve_version(&state, &account, &script, sel).await?;
            vec![state.fleet.memory(&account, &script, &v.id, window)]
        }
        // Every version something is known about, newest first.
        None => state
            .store
            .versions(&account, &script)
            .await?
            .iter()
            .map(|v| state.fleet.memory(&account, &script, &v.id, window))
            .filter(|m| m.has_data())
            .collect(),
    };
    Ok(Json(json!({
        "script": script,
        "versions": versions,
    })))
}

// ---- captures ----

async fn prepare_capture(
    state: &AppState,
    account: &str,
    script: &str,
    selector: &str,
    body: ProfileBody,
) -> ApiResult<CaptureSpec> {
    require_script(state, account, script).await?;
    let version = resolve_version(state, account, script, selector).await?;
    let targets: Vec<Target> = state.fleet.targets(&TargetQuery {
        account,
        script,
        version_id: Some(&version.id),
        data_center: body.data_center.as_deref(),
        durable_object: body.durable_object.as_deref(),
    });
    if targets.is_empty() {
        let message = match (&body.durable_object, &body.data_center) {
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
        account: account.to_owned(),
        script: script.to_owned(),
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
                    isolates.join(", "),
                    b.retry_after_secs
                ),
            };
            ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "too_many_captures",
                message,
                retry_after: Some(b.retry_after_secs),
            }
        }
        StartError::Store(e) => e.into(),
    }
}

async fn profile_sync(
    State(state): State<AppState>,
    Path((account, script, version)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    authorize(&state, &headers, &account).await?;
    let parsed = parse_profile_body(&body, false)?;
    let spec = prepare_capture(&state, &account, &script, &version, parsed).await?;
    let session = state.captures.start(spec).await.map_err(start_error)?;
    state.captures.wait(&session.id).await;
    let row = state
        .store
        .session(&account, &session.id)
        .await?
        .ok_or_else(|| ApiError::from(StoreError::Corrupt("session vanished".into())))?;
    if row.status == "failed" {
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
        h.insert("x-edgeprof-session", v);
    }
    if let Ok(v) = HeaderValue::from_str(&row.status) {
        h.insert("x-edgeprof-status", v);
    }
    let missing = missing_machines(&failures(&row));
    if !missing.is_empty()
        && let Ok(v) = HeaderValue::from_str(&missing.join(","))
    {
        h.insert("x-edgeprof-missing-machines", v);
    }
    Ok(resp)
}

async fn start_session(
    State(state): State<AppState>,
    Path(account): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    authorize(&state, &headers, &account).await?;
    let parsed = parse_profile_body(&body, true)?;
    let script = parsed.script.clone().unwrap_or_default();
    let version = parsed.version.clone().unwrap_or_else(|| "latest".into());
    let spec = prepare_capture(&state, &account, &script, &version, parsed).await?;
    let session = state.captures.start(spec).await.map_err(start_error)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "id": session.id, "status": session.status })),
    )
        .into_response())
}

fn failures(row: &SessionRow) -> Vec<Failure> {
    serde_json::from_str(&row.failures_json).unwrap_or_default()
}

fn missing_machines(failures: &[Failure]) -> Vec<String> {
    let mut names: Vec<String> = failures.iter().map(|f| f.machine.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn session_json(row: &SessionRow, detail: bool) -> Value {
    let failures = failures(row);
    let mut v = json!({
        "id": row.id,
        "script": row.script,
        "version_id": row.version_id,
        "version": row.version_selector,
        "profile_type": row.kind,
        "duration_ms": row.duration_ms,
        "data_center": row.data_center,
        "durable_object": row.durable_object,
        "status": row.status,
        "error": row.error,
        "created_at_ms": row.created_at_ms,
        "updated_at_ms": row.updated_at_ms,
        "progress": {
            "machines_total": row.machines_total,
            "machines_answered": row.machines_answered,
        },
        "missing_machines": missing_machines(&failures),
        "requests": row.requests,
    });
    if detail {
        let targets: Value = serde_json::from_str(&row.targets_json).unwrap_or(json!([]));
        v["targets"] = targets;
        v["failures"] = json!(failures);
    }
    v
}

#[derive(Debug, serde::Deserialize)]
struct SessionsQuery {
    script: Option<String>,
    limit: Option<String>,
}

async fn list_sessions(
    State(state): State<AppState>,
    Path(account): Path<String>,
    Query(q): Query<SessionsQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    let limit = match q.limit.as_deref() {
        None => 100,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_limit",
                    format!("limit: must be a whole number from 1 to 1000 (got `{l}`)"),
                ));
            }
        },
    };
    let rows = state
        .store
        .sessions(&account, q.script.as_deref(), limit)
        .await?;
    let profiles: Vec<Value> = rows.iter().map(|r| session_json(r, false)).collect();
    Ok(Json(json!({ "profiles": profiles })))
}

async fn find_session(state: &AppState, account: &str, id: &str) -> ApiResult<SessionRow> {
    state.store.session(account, id).await?.ok_or_else(|| {
        ApiError::not_found(
            "unknown_session",
            format!("profile session `{id}` not found in account `{account}`"),
        )
    })
}

async fn get_session(
    State(state): State<AppState>,
    Path((account, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    authorize(&state, &headers, &account).await?;
    let row = find_session(&state, &account, &id).await?;
    let mut v = session_json(&row, true);
    v["events"] = json!(state.store.session_events(&row.id).await?);
    Ok(Json(v))
}

async fn get_session_pprof(
    State(state): State<AppState>,
    Path((account, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    authorize(&state, &headers, &account).await?;
    let row = find_session(&state, &account, &id).await?;
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
            match row.status.as_str() {
                "failed" => format!(
                    "session `{id}` failed and has no profile: {}",
                    row.error.as_deref().unwrap_or("no reason recorded")
                ),
                s => format!("session `{id}` is still {s}; its profile is not ready"),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// `Ok(summary)` or `Err((code, message part))`.
    fn check(body: &str, async_form: bool, expect: Result<&str, (&str, &str)>) {
        let got = parse_profile_body(body.as_bytes(), async_form);
        match (got, expect) {
            (Ok(b), Ok(summary)) => {
                let s = format!(
                    "{} {}ms do={} dc={} script={} version={}",
                    b.kind.as_str(),
                    b.duration.as_millis(),
                    b.durable_object.as_deref().unwrap_or("-"),
                    b.data_center.as_deref().unwrap_or("-"),
                    b.script.as_deref().unwrap_or("-"),
                    b.version.as_deref().unwrap_or("-"),
                );
                assert_eq!(s, summary, "{body}");
            }
            (Err(e), Err((code, part))) => {
                assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
                assert_eq!(e.code, code, "{body}: {}", e.message);
                assert!(
                    e.message.contains(part),
                    "{body}: `{}` lacks `{part}`",
                    e.message
                );
            }
            (got, expect) => panic!("{body}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn profile_bodies() {
        let id = "AB".repeat(32);
        check("", false, Ok("cpu 10000ms do=- dc=- script=- version=-"));
        check(
            r#"{"duration_ms": 1000, "profile_type": "heap"}"#,
            false,
            Ok("heap 1000ms do=- dc=- script=- version=-"),
        );
        check(
            r#"{"duration_ms": 50000, "data_center": "lhr"}"#,
            false,
            Ok("cpu 50000ms do=- dc=lhr script=- version=-"),
        );
        check(
            &format!(r#"{{"namespace_id": "chat", "actor_id": "{id}"}}"#),
            false,
            Ok(&format!(
                "cpu 10000ms do=chat:{} dc=- script=- version=-",
                id.to_lowercase()
            )),
        );
        check(
            r#"{"script": "api"}"#,
            true,
            Ok("cpu 10000ms do=- dc=- script=api version=latest"),
        );
        check(
            r#"{"duration_ms": 999}"#,
            false,
            Err(("invalid_duration", "got 999")),
        );
        check(
            r#"{"duration_ms": 50001}"#,
            false,
            Err(("invalid_duration", "between 1000 and 50000")),
        );
        check(
            r#"{"duration_ms": -5}"#,
            false,
            Err(("invalid_duration", "whole number")),
        );
        check(
            r#"{"duration_ms": 1.5}"#,
            false,
            Err(("invalid_duration", "whole number")),
        );
        check(
            r#"{"profile_type": 3}"#,
            false,
            Err(("invalid_body", "profile_type: must be a string")),
        );
        check(
            r#"{"profile_type": "CPU"}"#,
            false,
            Err(("invalid_profile_type", "`CPU`")),
        );
        check("[1]", false, Err(("invalid_body", "must be a JSON object")));
        check("{", false, Err(("invalid_body", "not valid JSON")));
        check(
            r#"{"script": "api"}"#,
            false,
            Err(("invalid_body", "script: given in the URL")),
        );
        check(
            r#"{"script": "a b"}"#,
            true,
            Err(("invalid_name", "script: `a b`")),
        );
        check(
            r#"{"namespace_id": "", "actor_id": "00"}"#,
            false,
            Err(("invalid_durable_object", "namespace_id")),
        );
        check(
            &format!(r#"{{"namespace_id": "chat", "actor_id": "{id}", "data_center": "lhr"}}"#),
            false,
            Err(("invalid_data_center", "cannot be combined")),
        );
    }

    #[tokio::test]
    async fn router_answers_json_errors_without_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db.sqlite");
        let store = Arc::new(Store::open(db.to_str().unwrap()).await.unwrap());
        let metrics = Arc::new(Metrics::default());
        let state = AppState {
            store: store.clone(),
            fleet: Arc::new(Fleet::new(Duration::from_secs(5))),
            captures: Captures::new(
                store,
                metrics.clone(),
                crate::capture::CaptureSettings {
                    agent_secret: "secret-secret".into(),
                    slack: Duration::from_secs(1),
                    max_per_script: 2,
                    max_agent_response_bytes: 1 << 20,
                },
            ),
            metrics,
            max_wasm_bytes: 1 << 20,
        };
        let resp = app(state)
            .oneshot(
                axum::http::Request::get("/v1/accounts/acme/scripts")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "missing_token");
    }
}
