//! The one error shape of the REST API: [`ApiError`], rendered as
//! `{"error": {"code", "message"}}` ([`rest::ErrorBody`]), and the
//! conversions into it (names, storage, and every axum rejection: 400, 405,
//! 408, 413, 415).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use edgeprof_proto::rest;

use crate::names::NameError;
use crate::store::StoreError;
use crate::text::truncate;

/// Longest message an error answers with.
pub const MAX_MESSAGE_BYTES: usize = 2048;

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

/// What handlers return.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error of any status.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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

    /// 500 for a broken invariant (logged; the client sees no detail).
    pub fn internal(what: impl std::fmt::Display) -> Self {
        tracing::error!("{what:#}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the control plane's log",
        )
    }

    /// The same error, about `field` of a request body (a leading
    /// `version: ` of the selector's own message is replaced by it).
    pub fn in_field(mut self, field: &str) -> Self {
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
        ApiError::internal(format_args!("storage: {e}"))
    }
}

impl From<NameError> for ApiError {
    fn from(e: NameError) -> Self {
        ApiError::bad_request(e.code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = rest::ErrorBody {
            error: rest::ErrorDetail {
                code: self.code.to_owned(),
                message: truncate(&self.message, MAX_MESSAGE_BYTES),
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The error of a body that could not be read: too large (413, naming
/// the limit), too slow (408) or cut off (400).
pub fn body_error(e: axum::extract::rejection::BytesRejection, limit: usize) -> ApiError {
    use axum::extract::rejection::BytesRejection;
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            status,
            "body_too_large",
            format!("body: larger than the limit of {limit} bytes for this endpoint"),
        );
    }
    let timed_out = match &e {
        BytesRejection::FailedToBufferBody(f) => std::error::Error::source(f)
            .is_some_and(|s| s.to_string().contains(super::BODY_TIMEOUT)),
        _ => false,
    };
    if timed_out || e.body_text().contains(super::BODY_TIMEOUT) {
        return ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("body: {}", super::BODY_TIMEOUT),
        );
    }
    ApiError::bad_request(
        "invalid_body",
        format!("body: cannot be read: {}", e.body_text()),
    )
}

/// 404 for a path no route serves.
pub fn no_route(method: &str, path: &str) -> ApiError {
    ApiError::not_found(
        "not_found",
        format!(
            "no endpoint {method} {}; see docs/api.md for the REST reference",
            crate::text::echo(path)
        ),
    )
}

/// 405 for a method a route does not serve.
pub fn wrong_method(method: &str, path: &str) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{path} does not answer {method}; see docs/api.md for the REST reference",
            path = crate::text::echo(path)
        ),
    )
}
