//! The REST API: one router built by [`app`] over the typed contract of
//! `edgeprof_proto::rest` (reference: `docs/api.md`, checked against
//! [`ROUTES`] by a test), one error shape ([`error::ApiError`]), bearer
//! tokens scoped to one account ([`extract::Authorized`], checked before
//! any body is read).
//!
//! - [`scripts`]: scripts, versions, deployments, targets, memory.
//! - [`captures`]: capture requests, synchronous and asynchronous.
//! - [`sessions`]: capture sessions and their profiles; the account's
//!   tokens.
//! - [`history`]: continuous-profiling history, merged or as a timeline.
//!
//! Bodies: JSON routes accept at most [`JSON_BODY_LIMIT`] bytes, the wasm
//! upload its own limit; a body must keep arriving (each chunk within
//! [`BODY_TIMEOUT`]'s window, enforced by the HTTP server).
//!
//! Imports `store`, `fleet`, `capture` and leaf modules; never `registry`.

pub mod captures;
pub mod error;
pub mod extract;
pub mod history;
pub mod scripts;
pub mod sessions;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use crate::capture::Captures;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::store::Store;

pub use error::{ApiError, ApiResult};

/// Largest JSON body accepted.
pub const JSON_BODY_LIMIT: usize = 64 << 10;
/// What a body that stops arriving is told (and how it is recognized).
pub const BODY_TIMEOUT: &str = "the request body stopped arriving (idle timeout)";

/// The body limit of a route, for its 413 message.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Database.
    pub store: Arc<Store>,
    /// Live machines.
    pub fleet: Arc<Fleet>,
    /// This replica: [`AppState::fleet_now`] brings the fleet up to what
    /// every replica has heard.
    pub replica: Arc<crate::replica::Replica>,
    /// Capture runner.
    pub captures: Captures,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Largest accepted wasm upload.
    pub max_wasm_bytes: usize,
    /// What `now` and relative times of history queries read.
    pub clock: crate::clock::Clock,
}

impl AppState {
    /// Applies what other replicas heard up to now, so every replica
    /// answers about the fleet alike.
    pub async fn fleet_now(&self) -> Result<(), crate::store::StoreError> {
        self.replica.catch_up().await.map(|_| ())
    }
}

const SCRIPTS: &str = "/v1/accounts/{account}/scripts";
const VERSIONS: &str = "/v1/accounts/{account}/scripts/{script}/versions";
const VERSION: &str = "/v1/accounts/{account}/scripts/{script}/versions/{version}";
const DEPLOYMENT: &str = "/v1/accounts/{account}/scripts/{script}/deployment";
const TARGETS: &str = "/v1/accounts/{account}/scripts/{script}/targets";
const MEMORY: &str = "/v1/accounts/{account}/scripts/{script}/memory";
const PROFILE: &str = "/v1/accounts/{account}/scripts/{script}/versions/{version}/profile";
const PROFILES: &str = "/v1/accounts/{account}/profiles";
const SESSION: &str = "/v1/accounts/{account}/profiles/{id}";
const SESSION_PPROF: &str = "/v1/accounts/{account}/profiles/{id}/pprof";
const TOKENS: &str = "/v1/accounts/{account}/tokens";
const TOKEN: &str = "/v1/accounts/{account}/tokens/{id}";
const HISTORY_PROFILE: &str = "/v1/accounts/{account}/scripts/{script}/history/profile";
const HISTORY_TIMELINE: &str = "/v1/accounts/{account}/scripts/{script}/history/timeline";

/// Every route of [`app`], as `(method, path)`: what `docs/api.md`
/// documents, one `### METHOD path` heading each.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", SCRIPTS),
    ("GET", VERSIONS),
    ("POST", VERSIONS),
    ("DELETE", VERSION),
    ("GET", DEPLOYMENT),
    ("PUT", DEPLOYMENT),
    ("GET", TARGETS),
    ("GET", MEMORY),
    ("POST", PROFILE),
    ("GET", PROFILES),
    ("POST", PROFILES),
    ("GET", SESSION),
    ("GET", SESSION_PPROF),
    ("GET", TOKENS),
    ("DELETE", TOKEN),
    ("GET", HISTORY_PROFILE),
    ("GET", HISTORY_TIMELINE),
];

/// A stored count or size for the wire (never negative in the database).
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn limited(route: MethodRouter<AppState>, limit: usize) -> MethodRouter<AppState> {
    route
        .layer::<_, std::convert::Infallible>(DefaultBodyLimit::max(limit))
        .layer::<_, std::convert::Infallible>(axum::Extension(BodyLimit(limit)))
}

/// The router over `state`.
pub fn app(state: AppState) -> Router {
    let wasm = state.max_wasm_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route(SCRIPTS, get(scripts::list_scripts))
        .route(VERSIONS, get(scripts::list_versions))
        .route(VERSIONS, limited(post(scripts::upload_version), wasm))
        .route(VERSION, axum::routing::delete(scripts::delete_version))
        .route(
            DEPLOYMENT,
            get(scripts::get_deployment).put(scripts::put_deployment),
        )
        .route(TARGETS, get(scripts::targets))
        .route(MEMORY, get(scripts::memory))
        .route(PROFILE, post(captures::profile_sync))
        .route(
            PROFILES,
            get(sessions::list_sessions).post(captures::start_session),
        )
        .route(SESSION, get(sessions::get_session))
        .route(SESSION_PPROF, get(sessions::get_session_pprof))
        .route(TOKENS, get(sessions::list_tokens))
        .route(TOKEN, axum::routing::delete(sessions::revoke_token))
        .route(HISTORY_PROFILE, get(history::profile))
        .route(HISTORY_TIMELINE, get(history::timeline))
        .fallback(
            |method: Method, uri: Uri| async move { error::no_route(method.as_str(), uri.path()) },
        )
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            error::wrong_method(method.as_str(), uri.path())
        })
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT))
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
    state.metrics.http_response(resp.status().as_u16());
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
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

#[cfg(test)]
mod tests;
