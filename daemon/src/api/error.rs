//! API errors and the JSON body extractor.
//!
//! Every error leaves as `{"error":{"code":"…","message":"…"}}` with a fitting status.
//! The extractor reads the body under the size limit and parses it with
//! `serde_path_to_error`, so a wrong type or an unknown field is a 400 naming the field.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// An error answered to an API caller.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 with a code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500; the detail is logged, the caller gets a short message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error answering a request");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("internal error: {detail}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match e {
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} not found")),
            StoreError::Conflict(msg) => ApiError::new(StatusCode::CONFLICT, "conflict", msg),
            StoreError::Unavailable(msg) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!(
                    "the database is unavailable ({msg}); retry shortly (a candidate submitted again is answered from the store, never queued twice)"
                ),
            ),
            other => ApiError::internal(other),
        }
    }
}

/// A query string parsed into `T`; errors are JSON 400s like every other.
pub struct QueryArgs<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for QueryArgs<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
    }
}

/// A JSON request body of type `T`, parsed strictly.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "request body is larger than server.max_body_bytes",
                )
            } else {
                ApiError::bad_request("bad_body", e.body_text())
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses JSON strictly, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_json",
            "request body is empty; JSON expected",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let code = if inner.is_syntax() || inner.is_eof() {
            "invalid_json"
        } else {
            "invalid_field"
        };
        let msg = if path == "." || code == "invalid_json" {
            inner.to_string()
        } else {
            format!("field `{path}`: {inner}")
        };
        ApiError::bad_request(code, msg)
    })?;
    de.end().map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("trailing data after the JSON value: {e}"),
        )
    })?;
    Ok(value)
}

/// Reads one item of a JSON document already parsed (a batch's candidate) strictly, naming
/// the field at fault as [`parse_json`] does.
pub fn parse_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = if path == "." {
            inner.to_string()
        } else {
            format!("field `{path}`: {inner}")
        };
        ApiError::bad_request("invalid_field", msg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_types::Candidate;

    #[test]
    fn wrong_type_names_the_field() {
        let body = br#"{"problem":"p","language":"c","source":"x","launches":[{"kernel":"k","grid":"big"}]}"#;
        let err = parse_json::<Candidate>(body).expect_err("error");
        assert_eq!(err.code, "invalid_field");
        assert!(err.message.contains("launches[0].grid"), "{}", err.message);
    }

    #[test]
    fn syntax_errors_and_trailing_data_are_invalid_json() {
        assert_eq!(
            parse_json::<Candidate>(b"{").err().map(|e| e.code),
            Some("invalid_json")
        );
        assert_eq!(
            parse_json::<serde_json::Value>(b"{} {}")
                .err()
                .map(|e| e.code),
            Some("invalid_json")
        );
        assert_eq!(
            parse_json::<serde_json::Value>(b"").err().map(|e| e.code),
            Some("invalid_json")
        );
    }
}
