//! The worker's one error type: every failure a caller can see, as `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idgen::core::Refusal;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after_secs: Option<u64>,
}

impl From<crate::body::BodyError> for ApiError {
    fn from(error: crate::body::BodyError) -> Self {
        ApiError::bad_request(error.code, error.message)
    }
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, code, message: message.into(), retry_after_secs: None }
    }

    pub fn not_found() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: "no such endpoint; see GET /healthz, POST /v1/ids, POST /v1/ids:batch, GET /v1/ids/{id}/decode, POST /v1/uuids, GET /metrics, GET /openapi.json".into(),
            retry_after_secs: None,
        }
    }

    /// Over the caller's quota: 429 `over_quota` with the limiter's `Retry-After`.
    pub fn over_quota(over: idgen_server::OverQuota) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "over_quota",
            message: over.message,
            retry_after_secs: Some(over.retry_after_secs),
        }
    }

    /// The generator refuses to issue: 503 with the reason as the code and a `Retry-After`.
    pub fn refused(refusal: &Refusal) -> Self {
        let retry_after_secs = match refusal {
            Refusal::ClockBehind { behind_ms } => (*behind_ms as u64).div_ceil(1000).max(1),
            _ => 1,
        };
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: refusal.reason(),
            message: format!("refusing to issue: {refusal}"),
            retry_after_secs: Some(retry_after_secs),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({ "error": { "code": self.code, "message": self.message } }));
        let mut response = (self.status, body).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
