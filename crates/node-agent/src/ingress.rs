//! HTTP ingress: worker traffic in, responses out, routed by host name as
//! `workers.dev` does; plus `/healthz` on the machine's own name.
//!
//! - `http://{script}.{account}.{zone}/…` goes to an isolate of a version of
//!   that account's script, picked by the deployment weights; the worker sees
//!   the whole path. Tenancy is in the key: two accounts' `api` are two
//!   scripts ([`ScriptKey`]).
//! - `http://{script}.{account}.{zone}/do/{namespace}/{id}/…` goes to the one
//!   isolate of that Durable Object of that script ([`ObjectKey`]). A
//!   machine that does not own the object asks the control plane where it
//!   lives (placing it here on first use) and forwards the request there,
//!   host and all. A machine serves an object only while its lease holds
//!   ([`crate::lease`]); a request for a fenced object, or forwarded to a
//!   machine that no longer owns it, is resolved again through the control
//!   plane, never served from a stale copy. A forwarded request that reaches
//!   a machine the object does not live on is answered `421 Misdirected
//!   Request`, and the forwarding machine asks the control plane once more.
//! - Any other host: `/healthz`, else `404` naming the expected form.
//!
//! Operators' endpoints (`/metrics`, `/debug/pprof/profile`) are on a
//! listener of their own ([`operator_app`], `--operator-listen`, loopback by
//! default), never on the worker port. Headers named `x-edgeprof-*` are the
//! agents' own: a client's are dropped before routing, a worker's before
//! answering, and a forwarded request proves itself with the agent secret.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use edgeprof_sampler::Request as WorkerRequest;
use rand::Rng;

use crate::hosting::{
    Hosting, ObjectHere, ObjectKey, ScriptKey, ServeError, Slot, StartError, VersionRef,
};
use crate::metrics::Metrics;
use crate::registry::{DeployedScript, PlacementUnavailable, Registry};

/// Largest request body passed to a worker.
pub const MAX_BODY: usize = 1 << 20;
/// Header marking a request forwarded by another agent (loops are
/// refused); its value is the agent secret.
pub const FORWARDED: &str = "x-edgeprof-forwarded";
/// Prefix of the headers only agents may set.
pub const INTERNAL_HEADER_PREFIX: &str = "x-edgeprof-";
/// Header on an agent's own `421` for a Durable Object it does not hold
/// (so a worker's 421 is passed on, not taken for one).
pub const MISDIRECTED: &str = "x-edgeprof-misdirected";
/// How many times one Durable Object request is routed (the first try plus
/// re-resolutions after a fenced isolate or a misdirected forward).
const DURABLE_OBJECT_ATTEMPTS: usize = 3;

/// Shared state of the ingress.
#[derive(Debug, Clone)]
pub struct Ingress {
    /// Isolates of this machine.
    pub hosting: Arc<Hosting>,
    /// Control plane connection.
    pub registry: Arc<Registry>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Where Durable Objects owned elsewhere live: key → owner HTTP base URL.
    pub remote_objects: Arc<Mutex<HashMap<ObjectKey, String>>>,
    /// Client used to forward Durable Object requests.
    pub http: reqwest::Client,
    /// The zone worker hosts are under (`--zone`).
    pub zone: String,
    /// The agent secret, which a forwarded request carries.
    pub secret: Arc<str>,
}

/// The router: every request is routed by its host name ([`destination`]).
pub fn app(state: Ingress) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// The operator listener's router: `/metrics`, `/debug/pprof/profile`,
/// `/healthz`.
pub fn operator_app(state: Ingress) -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/metrics", axum::routing::get(metrics))
        .route(
            "/debug/pprof/profile",
            axum::routing::get(|Query(q): Query<HashMap<String, String>>| native_profile(q)),
        )
        .with_state(state)
}

/// Whether `headers` carry a forward from another agent (the secret), and
/// the headers without any `x-edgeprof-*` ones.
fn internal_headers_stripped(headers: HeaderMap, secret: &str) -> (bool, HeaderMap) {
    let forwarded = headers
        .get(FORWARDED)
        .is_some_and(|v| crate::capture::constant_time_eq(v.as_bytes(), secret.as_bytes()));
    let mut kept = HeaderMap::with_capacity(headers.len());
    let mut name = None;
    for (k, v) in headers {
        // `into_iter` names a header once, then `None` for its repeats.
        if let Some(k) = k {
            name = Some(k);
        }
        if let Some(k) = &name
            && !k.as_str().starts_with(INTERNAL_HEADER_PREFIX)
        {
            kept.append(k.clone(), v);
        }
    }
    (forwarded, kept)
}

/// Where a request's host name sends it.
#[derive(Debug, PartialEq, Eq)]
enum Destination {
    /// `{script}.{account}.{zone}`.
    Worker(ScriptKey),
    /// Not under the zone: the machine itself.
    Machine,
    /// Under the zone, but not `{script}.{account}`.
    NotAWorker,
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The host name without its port, lowercased.
fn host_name(host: &str) -> String {
    let host = host.trim().trim_end_matches('.');
    let name = if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn destination(host: &str, zone: &str) -> Destination {
    let name = host_name(host);
    let Some(labels) = name.strip_suffix(zone).and_then(|r| r.strip_suffix('.')) else {
        return Destination::Machine;
    };
    match labels.split('.').collect::<Vec<_>>().as_slice() {
        [script, account] if is_label(script) && is_label(account) => {
            Destination::Worker(ScriptKey {
                account: (*account).to_owned(),
                script: (*script).to_owned(),
            })
        }
        _ => Destination::NotAWorker,
    }
}

/// The request's host: `Host`, or the URI's authority (HTTP/2).
fn request_host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> &'a str {
    headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or_default()
}

async fn handle(
    State(s): State<Ingress>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let host = request_host(&uri, &headers).to_owned();
    let (forwarded, headers) = internal_headers_stripped(headers, &s.secret);
    match destination(&host, &s.zone) {
        Destination::Worker(key) => match object_path(uri.path()) {
            Some((namespace, id)) => {
                let object = ObjectKey {
                    script: key,
                    namespace,
                    id: id.to_ascii_lowercase(),
                };
                durable_object(s, object, forwarded, method, uri, headers, body).await
            }
            None => script(s, key, method, uri, headers, body).await,
        },
        Destination::Machine if uri.path() == "/healthz" => "ok\n".into_response(),
        Destination::Machine | Destination::NotAWorker => {
            let port = host
                .rsplit_once(':')
                .map(|(_, p)| format!(":{p}"))
                .unwrap_or_default();
            let zone = &s.zone;
            error(
                StatusCode::NOT_FOUND,
                format!(
                    "no worker at host `{}`: a worker is reached at http://{{script}}.{{account}}.{zone}{port}/… \
                     and its Durable Objects at http://{{script}}.{{account}}.{zone}{port}/do/{{namespace}}/{{id}}/…",
                    crate::hosting::truncate(&host, 256)
                ),
            )
        }
    }
}

/// `/do/{namespace}/{id}[/…]`: the object's namespace and id.
fn object_path(path: &str) -> Option<(String, String)> {
    let mut parts = path.strip_prefix("/do/")?.splitn(3, '/');
    let namespace = parts.next()?;
    let id = parts.next()?;
    Some((namespace.to_owned(), id.to_owned()))
}

/// No isolate could be had: over a cap (503, retry later), a version that
/// fails to start (502), or no thread (503).
fn start_error(e: &StartError) -> Response {
    let status = match e {
        StartError::Failing { .. } => StatusCode::BAD_GATEWAY,
        StartError::AtCapacity(_) | StartError::Thread(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut r = error(status, e.to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, 1.into());
    }
    r
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": {"code": status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"), "message": message.into()}});
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn metrics(State(s): State<Ingress>) -> Response {
    let slots = s.hosting.slots();
    let memory: u64 = slots.iter().map(|s| s.memory_bytes()).sum();
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(slots.len(), memory),
    )
        .into_response()
}

async fn native_profile(q: HashMap<String, String>) -> Response {
    let seconds: u64 = match q.get("seconds").map(|s| s.parse()) {
        None => 10,
        Some(Ok(n)) if (1..=60).contains(&n) => n,
        _ => return error(StatusCode::BAD_REQUEST, "seconds: must be an integer 1–60"),
    };
    match crate::native::profile(Duration::from_secs(seconds)).await {
        Ok(bytes) => ([("content-type", "application/octet-stream")], bytes).into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("native profile: {e:#}"),
        ),
    }
}

fn worker_request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
    strip: usize,
) -> WorkerRequest {
    let path = uri.path();
    let rest = path
        .splitn(strip + 2, '/')
        .nth(strip + 1)
        .map(|r| format!("/{r}"))
        .unwrap_or_else(|| "/".into());
    let path = match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest,
    };
    WorkerRequest {
        method: method.as_str().to_owned(),
        path,
        headers: headers
            .iter()
            .filter_map(|(k, v)| {
                v.to_str()
                    .ok()
                    .map(|v| (k.as_str().to_owned(), v.to_owned()))
            })
            .collect(),
        body: body.to_vec(),
    }
}

fn worker_response(r: edgeprof_sampler::Response) -> Response {
    let mut builder = axum::http::Response::builder()
        .status(StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK));
    for (k, v) in &r.headers {
        // A worker cannot speak for the agent (e.g. fake a misdirection).
        if !k.to_ascii_lowercase().starts_with(INTERNAL_HEADER_PREFIX) {
            builder = builder.header(k.as_str(), v.as_str());
        }
    }
    builder.body(Body::from(r.body)).unwrap_or_else(|_| {
        error(
            StatusCode::BAD_GATEWAY,
            "the worker returned an invalid header",
        )
    })
}

fn pick_version(script: &DeployedScript) -> Option<&edgeprof_proto::v1::DeployedVersion> {
    let total: u64 = script.versions.iter().map(|v| u64::from(v.weight)).sum();
    if total == 0 {
        return script.versions.first();
    }
    let mut x = rand::rng().random_range(0..total);
    for v in &script.versions {
        if x < u64::from(v.weight) {
            return Some(v);
        }
        x -= u64::from(v.weight);
    }
    script.versions.last()
}

/// The deployment of `key`, or the 404 saying it has none.
async fn deployed(s: &Ingress, key: &ScriptKey) -> Result<DeployedScript, Response> {
    match s.registry.script(key).await {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "script `{}` of account `{}` is not deployed",
                key.script, key.account
            ),
        )),
        Err(e) => Err(error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}"))),
    }
}

async fn version_of(s: &Ingress, key: &ScriptKey) -> Result<VersionRef, Response> {
    let script = deployed(s, key).await?;
    let Some(v) = pick_version(&script) else {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("{key} has no deployed version"),
        ));
    };
    match s
        .registry
        .version(&s.hosting, key, &v.version_id, &v.wasm_sha256)
        .await
    {
        Ok(r) => Ok(r),
        Err(e) => Err(error(StatusCode::BAD_GATEWAY, format!("{e:#}"))),
    }
}

async fn script(
    s: Ingress,
    key: ScriptKey,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if body.len() > MAX_BODY {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_BODY} bytes"),
        );
    }
    let version = match version_of(&s, &key).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let request = worker_request(&method, &uri, &headers, body, 0);
    serve(request, || s.hosting.pick(&version)).await
}

/// Sends `request` to the isolate `pick` names; an isolate evicted while the
/// request was queued is retried once on the isolate `pick` names next.
async fn serve(
    request: WorkerRequest,
    pick: impl Fn() -> Result<Arc<Slot>, StartError>,
) -> Response {
    for _ in 0..2 {
        let slot = match pick() {
            Ok(slot) => slot,
            Err(e) => return start_error(&e),
        };
        match slot.serve(request.clone(), None).await {
            Ok(r) => return worker_response(r),
            Err(ServeError::Worker(msg)) => return error(StatusCode::INTERNAL_SERVER_ERROR, msg),
            Err(ServeError::Gone | ServeError::Fenced) => continue,
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "isolate unavailable; try again",
    )
}

fn is_object_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn durable_object(
    s: Ingress,
    key: ObjectKey,
    forwarded: bool,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = &key.id;
    if !is_object_id(id) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("durable object id `{id}`: must be 64 hex characters"),
        );
    }
    if body.len() > MAX_BODY {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_BODY} bytes"),
        );
    }
    let script = match deployed(&s, &key.script).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let request = worker_request(&method, &uri, &headers, body.clone(), 3);
    // After a fenced isolate or a misdirected forward, ask the control
    // plane rather than trust what this machine remembers.
    let mut ask = false;
    for _ in 0..DURABLE_OBJECT_ATTEMPTS {
        let route = match route_object(&s, &script, &key, forwarded || ask).await {
            Ok(route) => route,
            Err(r) => return r,
        };
        match route {
            ObjectRoute::Here(slot, until) => {
                match slot.serve(request.clone(), Some(until)).await {
                    Ok(r) => return worker_response(r),
                    Err(ServeError::Worker(msg)) => {
                        return error(StatusCode::INTERNAL_SERVER_ERROR, msg);
                    }
                    // Evicted: the next lookup recreates its isolate.
                    Err(ServeError::Gone) => {}
                    Err(ServeError::Fenced) => ask = true,
                }
            }
            ObjectRoute::Elsewhere(owner_http) if forwarded => {
                let mut r = error(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "durable object {key} does not live on this machine; it lives at {owner_http}"
                    ),
                );
                r.headers_mut()
                    .insert(MISDIRECTED, axum::http::HeaderValue::from_static("1"));
                return r;
            }
            ObjectRoute::Elsewhere(owner_http) => {
                match forward(&s, &owner_http, &method, &uri, &headers, body.clone()).await {
                    Forwarded::Answer(r) => return r,
                    Forwarded::Misdirected => {
                        s.remote_objects
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&key);
                        ask = true;
                    }
                }
            }
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "durable object {key}: its placement kept changing while routing this request; retry"
        ),
    )
}

/// Where one request for a Durable Object goes.
enum ObjectRoute {
    /// Its isolate here, and the end of its lease.
    Here(Arc<Slot>, Instant),
    /// The owner's HTTP base URL.
    Elsewhere(String),
}

/// Where the request for object `key` goes: its isolate here while leased;
/// else, unless `ask`, the owner this machine remembers; else wherever the
/// control plane says (placing it here on first use).
async fn route_object(
    s: &Ingress,
    script: &DeployedScript,
    key: &ObjectKey,
    ask: bool,
) -> Result<ObjectRoute, Response> {
    let here = s.hosting.durable_object(key).map_err(|e| start_error(&e))?;
    let lease_ended = matches!(here, ObjectHere::Fenced);
    match here {
        ObjectHere::Serving(slot, until) => return Ok(ObjectRoute::Here(slot, until)),
        ObjectHere::Fenced => {}
        ObjectHere::Absent if ask => {}
        ObjectHere::Absent => {
            let remembered = s
                .remote_objects
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(key)
                .cloned();
            if let Some(url) = remembered {
                return Ok(ObjectRoute::Elsewhere(url));
            }
        }
    }
    s.metrics.placement_asked(lease_ended);
    place(s, script, key).await
}

/// Asks the control plane where object `key` lives. Here: confirms (or
/// starts) its isolate for the placement and lease the answer grants.
/// Elsewhere: drops any copy kept here, remembers the owner and returns its
/// HTTP base URL.
async fn place(
    s: &Ingress,
    script: &DeployedScript,
    key: &ObjectKey,
) -> Result<ObjectRoute, Response> {
    // A machine at its isolate cap places nothing new here: a flood of new
    // objects creates neither isolates nor placement rows.
    s.hosting
        .has_room(&key.script.account)
        .map_err(|e| start_error(&e))?;
    let (placed, sent) = s
        .registry
        .place_durable_object(
            &key.script.account,
            &key.script.script,
            &key.namespace,
            &key.id,
        )
        .await
        .map_err(|e| {
            let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}"));
            let retry = e
                .downcast_ref::<PlacementUnavailable>()
                .and_then(|p| p.retry_after);
            if let Some(retry) = retry {
                let secs = retry.as_secs_f64().ceil().max(1.0) as u64;
                resp.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, secs.into());
            }
            resp
        })?;
    let owner = placed.owner.unwrap_or_default();
    if owner.id != s.registry.machine.id {
        s.hosting.drop_durable_object(key);
        s.remote_objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), owner.http_address.clone());
        return Ok(ObjectRoute::Elsewhere(owner.http_address));
    }
    s.remote_objects
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(key);
    let sha = script
        .versions
        .iter()
        .find(|v| v.version_id == placed.version_id)
        .map(|v| v.wasm_sha256.as_str())
        .unwrap_or_default();
    let version = s
        .registry
        .version(&s.hosting, &key.script, &placed.version_id, sha)
        .await
        .map_err(|e| error(StatusCode::BAD_GATEWAY, format!("{e:#}")))?;
    let (slot, until) = s
        .hosting
        .confirm_durable_object(
            key,
            &version,
            placed.placed_at_ms,
            sent,
            Duration::from_millis(u64::from(placed.durable_object_lease_ms)),
        )
        .map_err(|e| start_error(&e))?;
    Ok(ObjectRoute::Here(slot, until))
}

/// What forwarding a request to an object's owner gave.
enum Forwarded {
    /// The owner's answer (or why it could not be reached), for the client.
    Answer(Response),
    /// The machine does not hold the object (any more): resolve again.
    Misdirected,
}

async fn forward(
    s: &Ingress,
    base: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Forwarded {
    s.metrics.forwarded();
    let url = format!(
        "{}{}",
        base.trim_end_matches('/'),
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut req = s
        .http
        .request(
            reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET),
            &url,
        )
        .header(FORWARDED, &*s.secret)
        .body(body);
    // The host goes along: it names the object's script and account.
    for (k, v) in headers {
        if k != "content-length" {
            req = req.header(k.as_str(), v.as_bytes());
        }
    }
    match req.send().await {
        Ok(resp)
            if resp.status() == reqwest::StatusCode::MISDIRECTED_REQUEST
                && resp.headers().contains_key(MISDIRECTED) =>
        {
            Forwarded::Misdirected
        }
        Ok(resp) => {
            let status =
                StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut builder = axum::http::Response::builder().status(status);
            for (k, v) in resp.headers() {
                if k != "content-length" && k != "transfer-encoding" {
                    builder = builder.header(k.as_str(), v.as_bytes());
                }
            }
            Forwarded::Answer(match resp.bytes().await {
                Ok(b) => builder
                    .body(Body::from(b))
                    .unwrap_or_else(|_| error(StatusCode::BAD_GATEWAY, "bad forwarded response")),
                Err(e) => error(StatusCode::BAD_GATEWAY, format!("forward to {base}: {e}")),
            })
        }
        Err(e) => {
            // The owner may be gone: forget it so the next request asks again.
            s.remote_objects
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|_, v| v != base);
            Forwarded::Answer(error(
                StatusCode::BAD_GATEWAY,
                format!("forward to the object's machine {base}: {e}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(script: &str, account: &str) -> Destination {
        Destination::Worker(ScriptKey {
            account: account.into(),
            script: script.into(),
        })
    }

    /// Regression test for issue 10: routing by script name alone served
    /// one account's `api` for both; the host names the account.
    #[test]
    fn hosts_name_the_script_and_its_account() {
        let cases = [
            (
                "api.acme.localhost:8081",
                "localhost",
                worker("api", "acme"),
            ),
            ("API.Acme.LocalHost.", "localhost", worker("api", "acme")),
            ("api.other.localhost", "localhost", worker("api", "other")),
            (
                "json-gateway.dev.edge.example.com",
                "edge.example.com",
                worker("json-gateway", "dev"),
            ),
            ("127.0.0.1:8081", "localhost", Destination::Machine),
            ("localhost:8081", "localhost", Destination::Machine),
            ("[::1]:8081", "localhost", Destination::Machine),
            ("api.acmelocalhost", "localhost", Destination::Machine),
            ("", "localhost", Destination::Machine),
            ("acme.localhost", "localhost", Destination::NotAWorker),
            ("a.api.acme.localhost", "localhost", Destination::NotAWorker),
            ("-api.acme.localhost", "localhost", Destination::NotAWorker),
            ("api_x.acme.localhost", "localhost", Destination::NotAWorker),
        ];
        for (host, zone, expected) in cases {
            assert_eq!(destination(host, zone), expected, "{host} under {zone}");
        }
    }

    #[test]
    fn client_sent_internal_headers_are_dropped_and_a_forward_needs_the_secret() {
        let mut h = HeaderMap::new();
        h.insert(FORWARDED, "1".parse().unwrap());
        h.insert("x-edgeprof-misdirected", "1".parse().unwrap());
        h.append("accept", "a".parse().unwrap());
        h.append("accept", "b".parse().unwrap());
        let (forwarded, kept) = internal_headers_stripped(h.clone(), "the-secret");
        assert!(!forwarded);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(kept.get_all("accept").iter().count(), 2);
        h.insert(FORWARDED, "the-secret".parse().unwrap());
        assert!(internal_headers_stripped(h, "the-secret").0);
    }

    #[test]
    fn object_paths_name_namespace_and_id() {
        assert_eq!(
            object_path("/do/counter/ab/increment"),
            Some(("counter".into(), "ab".into()))
        );
        assert_eq!(
            object_path("/do/counter/ab"),
            Some(("counter".into(), "ab".into()))
        );
        assert_eq!(object_path("/do/counter"), None);
        assert_eq!(object_path("/api/do/x/y"), None);
    }
}
