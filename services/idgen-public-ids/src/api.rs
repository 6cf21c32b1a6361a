//! The HTTP/JSON endpoints of SPEC §7.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idgen::core::uuid;
use serde_json::{Map, Value, json};

use idgen_server::{Caller, Quotas};

use crate::format::{self, Format, Keyring};
use crate::store::{Mapping, PublicIdStore};

const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_BATCH: usize = 1_000;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<PublicIdStore>,
    /// `None` when no KMS key is configured: the encrypted format is then unavailable.
    pub keyring: Option<Arc<Keyring>>,
    /// Public IDs created or resolved per second, per caller (a batch of N counts N).
    pub quotas: Arc<Quotas>,
}

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after_secs: Option<u64>,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_request",
            message: message.into(),
            retry_after_secs: None,
        }
    }
    /// The one answer for unknown, malformed and forged public IDs alike.
    fn not_found() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: "no such public ID".into(),
            retry_after_secs: None,
        }
    }
    /// Over the caller's quota: 429 with the limiter's `Retry-After`.
    fn over_quota(over: idgen_server::OverQuota) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "over_quota",
            message: over.message,
            retry_after_secs: Some(over.retry_after_secs),
        }
    }
    fn storage(error: sqlx::Error) -> Self {
        tracing::error!(%error, "public-ID storage");
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "storage_unavailable",
            message: "the database is unavailable".into(),
            retry_after_secs: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, Json(json!({"error": {"code": self.code, "message": self.message}}))).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
        }
        response
    }
}

/// Admits `n` public IDs for `caller`, counting them as served if admitted.
fn admit(state: &AppState, caller: &Caller, n: u32) -> Result<(), ApiError> {
    state.quotas.admit(caller, n).map_err(ApiError::over_quota)?;
    state.quotas.served(caller, n);
    Ok(())
}

async fn json_object(body: Body) -> Result<Map<String, Value>, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::bad(format!("request body is larger than {MAX_BODY_BYTES} bytes")))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(ApiError::bad("request body must be a JSON object")),
    }
}

/// The largest integer every JSON reader holds exactly (JavaScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_JSON_INTEGER: u64 = (1 << 53) - 1;

/// An internal ID: a non-negative 63-bit integer, as a decimal string, or as a JSON integer up to
/// 2^53 − 1. A larger JSON number was most likely rounded by a JavaScript caller before it was
/// sent (it would then name another ID), so it is refused with the advice to send a string.
pub fn parse_internal_id(value: &Value) -> Result<u64, ApiError> {
    let bad = || ApiError::bad(format!("internal_id must be a non-negative 63-bit integer, not {value}"));
    let id = match value {
        Value::String(text) if !text.is_empty() && text.len() <= 19 && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse::<u64>().map_err(|_| bad())?
        }
        Value::Number(n) => match n.as_u64() {
            Some(id) if id <= MAX_SAFE_JSON_INTEGER => id,
            Some(_) => return Err(unsafe_number(value)),
            // A float that is a whole number this large (1e19, 9007199254740993.0): the same.
            None if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f > MAX_SAFE_JSON_INTEGER as f64) => {
                return Err(unsafe_number(value));
            }
            None => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    if id >> 63 != 0 {
        return Err(bad());
    }
    Ok(id)
}

fn unsafe_number(value: &Value) -> ApiError {
    ApiError::bad(format!(
        "internal_id {value} is a JSON number above 2^53 - 1, which JavaScript and many JSON readers round \
         (it may already name another ID); send IDs as decimal strings (\"internal_id\": \"<digits>\")"
    ))
}

fn parse_format(value: Option<&Value>) -> Result<Format, ApiError> {
    match value {
        None => Ok(Format::Opaque),
        Some(Value::String(text)) => Format::parse(text)
            .ok_or_else(|| ApiError::bad(format!("format must be opaque, uuidv7 or encrypted, not {text:?}"))),
        Some(other) => Err(ApiError::bad(format!("format must be a string, not {other}"))),
    }
}

fn only_fields(body: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match body.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(field) => Err(ApiError::bad(format!("unknown field {field:?}; accepted: {allowed:?}"))),
        None => Ok(()),
    }
}

fn new_uuidv7() -> String {
    let mut seed = [0u8; 12];
    // If the OS generator fails we still have a time-ordered, mostly unique UUID; but it never
    // fails on Linux after boot.
    let _ = getrandom::fill(&mut seed);
    let counter = u64::from_le_bytes(seed[..8].try_into().expect("8"));
    let tail = u32::from_le_bytes(seed[8..].try_into().expect("4"));
    uuid::format(&uuid::new_v7(idgen::system_unix_ms(), counter, tail))
}

fn new_opaque() -> String {
    format::new_opaque().expect("the operating system's random source is available")
}

/// Creates (or finds) the public IDs of `ids` in `format`.
pub async fn map_ids(state: &AppState, ids: &[u64], format: Format) -> Result<Vec<Mapping>, ApiError> {
    match format {
        Format::Encrypted => {
            let keyring = state.keyring.as_ref().ok_or_else(|| ApiError {
                status: StatusCode::NOT_IMPLEMENTED,
                code: "format_unavailable",
                message: "the encrypted format needs a KMS key, and this service has none configured".into(),
                retry_after_secs: None,
            })?;
            ids.iter()
                .map(|&id| {
                    let public_id = keyring.encrypt(id).ok_or_else(|| ApiError {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        code: "format_unavailable",
                        message: "no data key is loaded for the encrypted format".into(),
                        retry_after_secs: None,
                    })?;
                    Ok(Mapping { internal_id: id, format, public_id, created: false })
                })
                .collect()
        }
        Format::Opaque => {
            state.store.create_batch(ids, format, &new_opaque, idgen::system_unix_ms()).await.map_err(ApiError::storage)
        }
        Format::Uuidv7 => {
            state.store.create_batch(ids, format, &new_uuidv7, idgen::system_unix_ms()).await.map_err(ApiError::storage)
        }
    }
}

fn mapping_json(m: &Mapping) -> Value {
    json!({"public_id": m.public_id, "internal_id": m.internal_id.to_string(), "format": m.format.as_str()})
}

pub async fn create(State(state): State<AppState>, caller: Caller, body: Body) -> Result<Response, ApiError> {
    let body = json_object(body).await?;
    only_fields(&body, &["internal_id", "format"])?;
    admit(&state, &caller, 1)?;
    let id = parse_internal_id(body.get("internal_id").ok_or_else(|| ApiError::bad("internal_id is required"))?)?;
    let format = parse_format(body.get("format"))?;
    let mapping = map_ids(&state, &[id], format).await?.remove(0);
    // Encrypted IDs are computed, never created: always 200.
    let status = if mapping.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(mapping_json(&mapping))).into_response())
}

pub async fn create_batch(State(state): State<AppState>, caller: Caller, body: Body) -> Result<Json<Value>, ApiError> {
    let body = json_object(body).await?;
    only_fields(&body, &["internal_ids", "format"])?;
    let ids = body
        .get("internal_ids")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("internal_ids (an array of 1 to 1000 internal IDs) is required"))?;
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ApiError::bad(format!("internal_ids must hold 1 to {MAX_BATCH} IDs, not {}", ids.len())));
    }
    let mut parsed: Vec<u64> = ids.iter().map(parse_internal_id).collect::<Result<_, _>>()?;
    admit(&state, &caller, ids.len() as u32)?;
    parsed.sort_unstable();
    parsed.dedup();
    let format = parse_format(body.get("format"))?;
    let mappings = map_ids(&state, &parsed, format).await?;
    let by_id: std::collections::HashMap<u64, &Mapping> = mappings.iter().map(|m| (m.internal_id, m)).collect();
    let ordered: Vec<Value> = ids
        .iter()
        .map(|v| {
            let m = by_id[&parse_internal_id(v).expect("parsed above")];
            let mut j = mapping_json(m);
            j["created"] = json!(m.created);
            j
        })
        .collect();
    Ok(Json(json!({"public_ids": ordered})))
}

pub async fn resolve(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    admit(&state, &caller, 1)?;
    let Ok(Path(public_id)) = path else { return Err(ApiError::not_found()) };
    let internal = match public_id.len() {
        28 => state.keyring.as_ref().and_then(|k| k.decrypt(&public_id)),
        26 if format::is_opaque_text(&public_id) => state.store.resolve(&public_id).await.map_err(ApiError::storage)?,
        36 if uuid::parse_v7(&public_id).is_ok() => {
            state.store.resolve(&public_id.to_ascii_lowercase()).await.map_err(ApiError::storage)?
        }
        _ => None,
    };
    let internal = internal.ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({"public_id": public_id, "internal_id": internal.to_string()})))
}

#[derive(serde::Deserialize)]
pub struct FormatQuery {
    format: Option<String>,
}

pub async fn lookup(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FormatQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(text) = path.map_err(|_| ApiError::bad("the internal ID in the path is not valid UTF-8"))?;
    let Query(query) = query.map_err(|e| ApiError::bad(e.body_text()))?;
    admit(&state, &caller, 1)?;
    let id = parse_internal_id(&Value::String(text))?;
    let format = parse_format(query.format.map(Value::String).as_ref())?;
    let public_id = match format {
        Format::Encrypted => map_ids(&state, &[id], format).await?.remove(0).public_id,
        stored => state.store.lookup(id, stored).await.map_err(ApiError::storage)?.ok_or_else(|| ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: format!("internal ID {id} has no {} public ID", stored.as_str()),
            retry_after_secs: None,
        })?,
    };
    Ok(Json(json!({"public_id": public_id, "internal_id": id.to_string(), "format": format.as_str()})))
}

pub async fn healthz(State(state): State<AppState>) -> Json<Value> {
    let encrypted = state.keyring.as_ref().map(|k| json!({"key_versions": k.versions()}));
    Json(json!({"status": "ok", "encrypted": encrypted}))
}

pub async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: "no such endpoint".into(),
        retry_after_secs: None,
    }
}

pub async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed",
        message: "this endpoint does not accept that method".into(),
        retry_after_secs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(value: Value) -> String {
        let error = parse_internal_id(&value).unwrap_err();
        assert_eq!((error.status, error.code), (StatusCode::BAD_REQUEST, "invalid_request"));
        error.message
    }

    #[test]
    fn internal_ids_as_strings_or_exact_small_integers() {
        assert_eq!(parse_internal_id(&json!("9223372036854775807")).unwrap(), i64::MAX as u64);
        assert_eq!(parse_internal_id(&json!(555)).unwrap(), 555);
        assert_eq!(parse_internal_id(&json!(MAX_SAFE_JSON_INTEGER)).unwrap(), MAX_SAFE_JSON_INTEGER);
    }

    #[test]
    fn json_numbers_above_2_to_the_53_are_refused_with_advice() {
        // What a JavaScript caller sends for 2^53 + 1 after rounding, and larger exact integers.
        for value in [json!(MAX_SAFE_JSON_INTEGER + 1), json!(i64::MAX as u64), json!(u64::MAX), json!(1e19)] {
            let message = message(value.clone());
            assert!(message.contains("above 2^53 - 1") && message.contains("decimal strings"), "{value}: {message}");
        }
        for value in [json!(-1), json!(1.5), json!("1e3"), json!(""), json!("9223372036854775808"), json!(null)] {
            let message = message(value.clone());
            assert!(message.contains("non-negative 63-bit integer"), "{value}: {message}");
        }
    }
}
