//! The one error every service answers with: a status, a code, a message, and `Retry-After`
//! where waiting helps. The body, `{"error": {"code": "…", "message": "…"}}` (SPEC §4.1), is
//! written here and nowhere else; so is the reading of a request body, whose refusals are
//! `idgen_json::body`'s codes.
//!
//! Every 503 carries `Retry-After` (one second unless the error says otherwise): a 503 is
//! "not now", and a caller is told when to ask again. A 429 carries the limiter's.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idgen_json::body::{BODY_TOO_LARGE, BodyError};
use serde::Serialize;

use crate::OverQuota;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after_secs: Option<u64>,
}

impl ApiError {
    /// `status` with `code`; a 503 waits a second unless [`ApiError::retry_after`] says otherwise.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let retry_after_secs = (status == StatusCode::SERVICE_UNAVAILABLE).then_some(1);
        ApiError { status, code, message: message.into(), retry_after_secs }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    /// 503: not now; `Retry-After: 1` unless [`ApiError::retry_after`] says otherwise.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    /// Over the caller's quota: 429 `over_quota` with the limiter's `Retry-After`.
    pub fn over_quota(over: OverQuota) -> Self {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "over_quota", over.message).retry_after(over.retry_after_secs)
    }

    /// A body past `limit` bytes: 413 `body_too_large`, HTTP's status for it (RFC 9110 §15.5.14;
    /// SPEC §4.1 had grouped it with the other bad bodies under 400, and the code is the same).
    pub fn body_too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            BODY_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// The same error, to be asked again in `secs` seconds (whole, at least one).
    pub fn retry_after(self, secs: u64) -> Self {
        ApiError { retry_after_secs: Some(secs.max(1)), ..self }
    }

    /// The same error with its message added to.
    pub fn map_message(self, more: impl FnOnce(String) -> String) -> Self {
        ApiError { message: more(self.message), ..self }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_secs
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl From<BodyError> for ApiError {
    fn from(refused: BodyError) -> Self {
        ApiError::bad_request(refused.code, refused.message)
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: Detail { code: self.code, message: &self.message } };
        let bytes = serde_json::to_vec(&body).expect("two strings serialize");
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A request's body, refused past `limit` bytes (also when a client goes away mid-body: the
/// body cannot be read either way), or in more than [`max_frames`] frames. Read frame by frame:
/// a small body is one frame, taken as it is.
pub async fn read_body(mut body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use axum::body::HttpBody;
    use http_body_util::BodyExt;
    if body.size_hint().lower() > limit as u64 {
        return Err(ApiError::body_too_large(limit));
    }
    // One frame (the common case) is kept as it came; more are appended into one buffer, each byte
    // copied once: a body sent a byte a frame costs its length, not its length squared.
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let (mut length, mut frames, max_frames) = (0usize, 0usize, max_frames(limit));
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame.map_err(|_| ApiError::body_too_large(limit))?.into_data() else {
            continue; // trailers
        };
        frames += 1;
        if frames > max_frames {
            return Err(ApiError::bad_request(
                BODY_FRAGMENTED,
                format!("the request body came in more than {max_frames} pieces: send it in fewer, larger chunks"),
            ));
        }
        length += chunk.len();
        if length > limit {
            return Err(ApiError::body_too_large(limit));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            earlier => {
                if let Some(earlier) = earlier {
                    joined.reserve(limit.min(earlier.len() + chunk.len()));
                    joined.extend_from_slice(&earlier);
                }
                joined.extend_from_slice(&chunk);
            }
        }
        if body.is_end_stream() {
            break; // all of it (no need to poll once more for the end)
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// The error code of a body refused for its number of frames ([`max_frames`]).
pub const BODY_FRAGMENTED: &str = "body_fragmented";

/// How many frames (HTTP/1.1 chunks) a body of at most `limit` bytes may come in: one for every
/// 16 bytes of the limit, and at least 256 (a chunk split across two reads of the socket is two
/// frames). Each frame costs the service a hand-off from the connection to the handler whatever
/// its size (about 0.7 µs of CPU on the release build): a 64 KiB body sent a byte a chunk cost
/// about 48 ms of CPU, and costs 1.9 ms refused at the cap (`scripts/body-cost`). A client that streams its JSON a token a
/// chunk still sends pieces of several bytes on average; none sends a body a byte at a time
/// but to cost the service its time.
pub fn max_frames(limit: usize) -> usize {
    (limit / 16).max(256)
}

/// A request's body, a JSON object of at most `limit` bytes, as `T` ([`idgen_json::body`]).
pub async fn read_json<T: serde::de::DeserializeOwned>(body: Body, limit: usize) -> Result<T, ApiError> {
    Ok(idgen_json::body::read_object(&read_body(body, limit).await?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(error: ApiError) -> (StatusCode, Option<String>, serde_json::Value) {
        let response = error.into_response();
        let retry = response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_owned());
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn every_error_has_one_body_and_every_503_a_retry_after() {
        let (status, retry, body) = answer(ApiError::bad_request("invalid_count", "no \"quotes\" lost")).await;
        assert_eq!((status, retry), (StatusCode::BAD_REQUEST, None));
        assert_eq!(body, serde_json::json!({"error": {"code": "invalid_count", "message": "no \"quotes\" lost"}}));
        let (status, retry, _) = answer(ApiError::unavailable("storage_unavailable", "down")).await;
        assert_eq!((status, retry.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")));
        let (_, retry, _) = answer(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "lease", "none")).await;
        assert_eq!(retry.as_deref(), Some("1"), "a 503 made any way waits");
        let (_, retry, _) = answer(ApiError::unavailable("clock_behind", "behind").retry_after(7)).await;
        assert_eq!(retry.as_deref(), Some("7"));
        let over = OverQuota { caller: "a".into(), retry_after_secs: 3, message: "slow down".into() };
        let (status, retry, body) = answer(ApiError::over_quota(over)).await;
        assert_eq!(
            (status, retry.as_deref(), body["error"]["code"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("3"), Some("over_quota"))
        );
    }

    #[tokio::test]
    async fn a_body_past_its_limit_is_refused_unread() {
        assert_eq!(read_body(Body::from("x".repeat(11)), 10).await.unwrap_err().code(), BODY_TOO_LARGE);
        assert_eq!(read_body(Body::from("x".repeat(10)), 10).await.unwrap().len(), 10);
        let refused = read_json::<serde_json::Value>(Body::from("[1]"), 10).await.unwrap_err();
        assert_eq!((refused.status(), refused.code()), (StatusCode::BAD_REQUEST, "invalid_body"));
    }

    /// A body sent `step` bytes a frame.
    struct Drip {
        bytes: Vec<u8>,
        sent: usize,
        step: usize,
    }

    impl hyper::body::Body for Drip {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            let (sent, step) = (self.sent, self.step);
            let Some(piece) = self.bytes.get(sent..(sent + step).min(self.bytes.len())).filter(|p| !p.is_empty())
            else {
                return std::task::Poll::Ready(None);
            };
            let frame = hyper::body::Frame::data(Bytes::copy_from_slice(piece));
            self.sent += piece.len();
            std::task::Poll::Ready(Some(Ok(frame)))
        }
    }

    #[tokio::test]
    async fn a_body_of_many_frames_is_joined_whole_and_refused_past_its_limit() {
        // Each frame used to copy everything received before it.
        let text: Vec<u8> = (0..65_536u32).map(|i| b'a' + (i % 26) as u8).collect();
        let read = read_body(Body::new(Drip { bytes: text.clone(), sent: 0, step: 32 }), 65_536).await.unwrap();
        assert_eq!(read.as_ref(), text.as_slice());
        let over = read_body(Body::new(Drip { bytes: text.clone(), sent: 0, step: 32 }), 65_535).await.unwrap_err();
        assert_eq!((over.status(), over.code()), (StatusCode::PAYLOAD_TOO_LARGE, BODY_TOO_LARGE));
    }

    /// A body in more frames than its limit allows is refused at the first one past them, its
    /// length whatever it is; one in as many is read.
    #[tokio::test]
    async fn a_body_in_too_many_frames_is_refused() {
        let limit = 64 * 1024;
        let allowed = max_frames(limit);
        assert_eq!(allowed, 4_096);
        let text: Vec<u8> = vec![b' '; allowed];
        let read = read_body(Body::new(Drip { bytes: text.clone(), sent: 0, step: 1 }), limit).await.unwrap();
        assert_eq!(read.len(), allowed);
        let drip = Drip { bytes: [text, vec![b' ']].concat(), sent: 0, step: 1 };
        let refused = read_body(Body::new(drip), limit).await.unwrap_err();
        assert_eq!((refused.status(), refused.code()), (StatusCode::BAD_REQUEST, BODY_FRAGMENTED));
        assert_eq!(max_frames(1_024), 256, "a small limit still allows 256");
    }
}
