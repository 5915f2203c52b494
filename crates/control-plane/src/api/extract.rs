//! Extractors: [`Authorized`] (the account's token, checked before any
//! body is read), and typed bodies and query strings whose errors name the
//! field ([`Json`], [`Query`]).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::{ApiError, body_error};
use crate::auth::{BearerError, bearer};
use crate::names::AccountId;
use crate::store::token_id;
use crate::text::{echo, truncate};

/// A request whose bearer token belongs to the `{account}` of its path.
#[derive(Debug, Clone)]
pub struct Authorized {
    /// The account, parsed.
    pub account: AccountId,
    /// The public id of the token used.
    pub token_id: String,
}

impl FromRequestParts<AppState> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        let token = bearer(value.as_deref()).map_err(|e| match e {
            BearerError::Missing => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_token",
                "missing `Authorization: Bearer <token>` header",
            ),
            BearerError::Malformed => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the Authorization header must be `Bearer <token>`",
            ),
        })?;
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::internal(format_args!("path parameters: {e}")))?;
        let raw = params
            .iter()
            .find(|(k, _)| *k == "account")
            .map(|(_, v)| v.to_owned())
            .ok_or_else(|| ApiError::internal("Authorized on a route without {account}"))?;
        let account = AccountId::parse("account", &raw)?;
        match state.store.token_account(token).await? {
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "unknown or revoked API token",
            )),
            Some(owner) if owner != account.as_str() => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "this token belongs to another account and cannot access account `{account}`"
                ),
            )),
            Some(_) => Ok(Authorized {
                account,
                token_id: token_id(token),
            }),
        }
    }
}

/// The error code for a bad value of `field` (the last segment of a serde
/// path such as `versions[0].weight`).
fn field_code(path: &str, fallback: &'static str) -> &'static str {
    let field = path.rsplit('.').next().unwrap_or(path);
    match field {
        "duration_ms" => "invalid_duration",
        "profile_type" => "invalid_profile_type",
        "limit" => "invalid_limit",
        "window_s" => "invalid_window",
        "weight" => "invalid_weight",
        _ => fallback,
    }
}

/// The rule of a field with a code, for messages.
fn rule(code: &str) -> Option<&'static str> {
    Some(match code {
        "invalid_profile_type" => "must be `cpu` or `heap`",
        "invalid_duration" => "must be a whole number of milliseconds from 1000 to 50000",
        "invalid_window" => "must be a whole number of seconds from 1 to 300",
        "invalid_limit" => "must be a whole number from 1 to 1000",
        "invalid_weight" => "must be a whole number from 0 to 100",
        _ => return None,
    })
}

fn deserialize_error<E: std::fmt::Display>(
    e: serde_path_to_error::Error<E>,
    what: &str,
    fallback: &'static str,
    raw: impl Fn(&str) -> Option<String>,
) -> ApiError {
    let path = e.path().to_string();
    let inner = truncate(&e.inner().to_string(), 300);
    let field = if path == "." || path.is_empty() {
        what.to_owned()
    } else {
        path.clone()
    };
    let code = field_code(&path, fallback);
    let message = match (rule(code), raw(&path)) {
        (Some(rule), Some(value)) => format!("{field}: {rule} (got `{}`)", echo(&value)),
        (Some(rule), None) => format!("{field}: {rule} ({inner})"),
        (None, _) => format!("{field}: {inner}"),
    };
    ApiError::bad_request(code, message)
}

/// Parses a JSON body as `T` (an empty body as `{}`).
pub fn parse_json<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    let raw: &[u8] = if raw.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        raw
    };
    if raw.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request(
            "invalid_body",
            "body: must be a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| deserialize_error(e, "body", "invalid_body", |_| None))?;
    de.end()
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: not valid JSON: {e}")))?;
    Ok(value)
}

/// A JSON body as `T`: `Content-Type` absent or JSON (else 415), within the
/// route's limit (else 413), every field error naming the field.
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("");
            let essence = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let json = essence == "application/json" || essence.ends_with("+json");
            // curl -d sends this by default; its body is still the JSON given.
            let curl = essence == "application/x-www-form-urlencoded";
            if !json && !curl {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    format!(
                        "Content-Type: `{}` is not JSON; send `application/json`",
                        echo(ct)
                    ),
                ));
            }
        }
        let bytes = body(req, state).await?;
        parse_json(&bytes).map(Json)
    }
}

/// The body as bytes, within the route's limit.
pub async fn body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let limit = req
        .extensions()
        .get::<super::BodyLimit>()
        .map_or(super::JSON_BODY_LIMIT, |l| l.0);
    Bytes::from_request(req, state)
        .await
        .map_err(|e| body_error(e, limit))
}

/// The raw body of a route (the wasm upload), within its limit.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        body(req, state).await.map(RawBody)
    }
}

/// A query string as `T`, every error naming the parameter.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(Query)
            .map_err(|e| {
                deserialize_error(e, "query", "invalid_query", |field| {
                    form_urlencoded::parse(q.as_bytes())
                        .find(|(k, _)| k == field)
                        .map(|(_, v)| v.into_owned())
                })
            })
    }
}
