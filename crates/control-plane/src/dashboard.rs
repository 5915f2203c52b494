//! The browser dashboard, served by the control plane itself: `GET /` is
//! `index.html` and `GET /assets/{file}` the page's scripts, styles and the
//! viewer's wasm, read from a directory at request time
//! ([`Config::dashboard_dir`](crate::Config::dashboard_dir), by default the
//! `target/dist` that `cargo xtask dist` writes). Reading at request time keeps
//! `cargo build` working on a fresh clone; when the directory has not been
//! built, `/` answers a 404 page telling to run `cargo xtask dist`.

use std::path::{Path, PathBuf};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

/// The dashboard directory `cargo xtask dist` writes: `target/dist` of the
/// workspace this crate was built in.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/dist")
}

/// The routes `/` and `/assets/{file}` over `dir`.
pub fn routes(dir: PathBuf) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/assets/{file}", get(asset))
        .with_state(dir)
}

async fn index(State(dir): State<PathBuf>) -> Response {
    let path = dir.join("index.html");
    match tokio::fs::read(&path).await {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            bytes,
        )
            .into_response(),
        Err(e) => (
            StatusCode::NOT_FOUND,
            Html(format!(
                "<!doctype html><title>edgeprof: dashboard not built</title>\
                 <h1>The dashboard is not built</h1>\
                 <p>The control plane serves the dashboard from <code>{}</code>, \
                 which cannot be read ({}). Run <code>cargo xtask dist</code> in the \
                 repository, or start the control plane with \
                 <code>--dashboard-dir DIR</code> pointing at a built one.</p>\
                 <p>The REST API under <code>/v1/</code> works regardless.</p>",
                escape(&path.display().to_string()),
                escape(&e.to_string()),
            )),
        )
            .into_response(),
    }
}

async fn asset(State(dir): State<PathBuf>, UrlPath(file): UrlPath<String>) -> Response {
    let safe = !file.is_empty()
        && !file.starts_with('.')
        && file
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !safe {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    }
    let content_type = match file.rsplit('.').next() {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("html") => "text/html; charset=utf-8",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    };
    match tokio::fs::read(dir.join("assets").join(&file)).await {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => (
            StatusCode::NOT_FOUND,
            format!("no asset {file}; run `cargo xtask dist` to build the dashboard"),
        )
            .into_response(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(dir: &Path, uri: &str) -> (StatusCode, String, String) {
        let resp = routes(dir.to_path_buf())
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ct, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn unbuilt_dashboard_says_to_run_dist_and_assets_are_confined() {
        let dir = tempfile::tempdir().unwrap();
        let (status, _, body) = get(dir.path(), "/").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("cargo xtask dist"), "{body}");

        std::fs::create_dir(dir.path().join("assets")).unwrap();
        std::fs::write(dir.path().join("assets/viewer_bg.wasm"), b"\0asm").unwrap();
        std::fs::write(dir.path().join("secret"), b"no").unwrap();
        let (status, ct, _) = get(dir.path(), "/assets/viewer_bg.wasm").await;
        assert_eq!((status, ct.as_str()), (StatusCode::OK, "application/wasm"));
        let (status, _, _) = get(dir.path(), "/assets/..%2Fsecret").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}
