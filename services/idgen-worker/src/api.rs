//! The HTTP/JSON endpoints of SPEC §4.1. Every handler answers from memory.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idgen::core::{Schedule, format_unix_ms, uuid};
use idgen::{Health, IdGenerator, SyncStatus};
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// Request bodies are tiny (`{"count": 1000}`); anything bigger is refused unread.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
pub const MAX_BATCH: u64 = 1_000;

#[derive(Clone)]
pub struct AppState {
    pub generator: Arc<IdGenerator>,
    /// Region names by number, for decoding (until the registry supplies them).
    pub region_names: Arc<std::sync::RwLock<HashMap<u32, String>>>,
    pub region: Arc<str>,
    pub region_number: u32,
    pub holder: Arc<str>,
    /// Development mode (`/healthz` says so).
    pub development: bool,
    pub registry: Arc<Registry>,
    pub http_metrics: Arc<crate::http_metrics::HttpMetrics>,
}

/// Reads at most `MAX_BODY_BYTES`; an empty body (or only whitespace) is `None`.
async fn read_body(body: Body) -> Result<Option<Map<String, Value>>, ApiError> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        ApiError::bad_request("body_too_large", format!("request body is larger than {MAX_BODY_BYTES} bytes"))
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) | Err(_) => Err(ApiError::bad_request("invalid_body", "request body must be a JSON object")),
    }
}

/// `{"count": n}` with 1 ≤ n ≤ 1000; nothing else allowed in the object.
fn parse_count(body: Option<Map<String, Value>>, default: Option<u64>) -> Result<u32, ApiError> {
    let mut body = body.unwrap_or_default();
    let count = body.remove("count");
    if let Some(field) = body.keys().next() {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("unknown field {field:?}; only \"count\" is accepted"),
        ));
    }
    let count = match (count, default) {
        (Some(value), _) => value.as_u64().filter(|n| (1..=MAX_BATCH).contains(n)).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_count",
                format!("count must be an integer from 1 to {MAX_BATCH}, not {value}"),
            )
        })?,
        (None, Some(default)) => default,
        (None, None) => return Err(ApiError::bad_request("invalid_count", "count is required: {\"count\": 1..1000}")),
    };
    Ok(count as u32)
}

pub async fn create_id(State(state): State<AppState>, body: Body) -> Result<Json<Value>, ApiError> {
    if let Some(field) = read_body(body).await?.and_then(|body| body.keys().next().cloned()) {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("unknown field {field:?}; send {{}} or an empty body"),
        ));
    }
    let id = state.generator.next_id().await.map_err(|refusal| ApiError::refused(&refusal))?;
    Ok(Json(json!({ "id": id.to_string(), "id_num": id })))
}

pub async fn create_batch(State(state): State<AppState>, body: Body) -> Result<Response, ApiError> {
    let count = parse_count(read_body(body).await?, None)?;
    let ids = state.generator.next_ids(count).await.map_err(|refusal| ApiError::refused(&refusal))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], ids_json(&ids)).into_response())
}

/// `{"ids":["…","…"]}` written straight into one buffer. At the layout cap a worker answers ~4,000
/// of these a second; building a string and a JSON value per ID first cost most of a core.
pub fn ids_json(ids: &[u64]) -> Vec<u8> {
    let mut body = Vec::with_capacity(10 + ids.len() * 22);
    body.extend_from_slice(b"{\"ids\":[");
    let mut digits = itoa::Buffer::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'"');
        body.extend_from_slice(digits.format(*id).as_bytes());
        body.push(b'"');
    }
    body.extend_from_slice(b"]}");
    body
}

pub async fn create_uuids(State(state): State<AppState>, body: Body) -> Result<Json<Value>, ApiError> {
    let count = parse_count(read_body(body).await?, Some(1))?;
    let uuids = state.generator.next_uuids(count).await.map_err(|refusal| ApiError::refused(&refusal))?;
    Ok(Json(json!({ "ids": uuids.iter().map(uuid::format).collect::<Vec<_>>() })))
}

/// What a decode path segment is: a 63-bit ID or a UUIDv7.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdText {
    Snowflake(u64),
    Uuid([u8; 16]),
}

pub fn parse_id(text: &str) -> Result<IdText, ApiError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let too_big = || {
            ApiError::bad_request(
                "invalid_id",
                format!("{text} is out of range: an ID is a non-negative 63-bit integer (< 2^63)"),
            )
        };
        let value: u64 = text.parse().map_err(|_| too_big())?;
        if value >> 63 != 0 {
            return Err(too_big());
        }
        return Ok(IdText::Snowflake(value));
    }
    if text.contains('-') {
        return uuid::parse_v7(text)
            .map(IdText::Uuid)
            .map_err(|error| ApiError::bad_request("invalid_id", format!("{text:?}: {error}")));
    }
    Err(ApiError::bad_request("invalid_id", format!("{text:?} is neither a non-negative 63-bit integer nor a UUIDv7")))
}

pub async fn decode(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(text) = path.map_err(|_| ApiError::bad_request("invalid_id", "the ID in the path is not valid UTF-8"))?;
    let schedule = state.generator.with_core(|core| core.schedule().clone());
    let names = state.region_names.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    decode_to_json(&text, &schedule, &names).map(Json)
}

/// The decode answer for a 63-bit ID or a UUIDv7, as the endpoint and `idgen decode` give it.
pub fn decode_to_json(text: &str, schedule: &Schedule, region_names: &HashMap<u32, String>) -> Result<Value, ApiError> {
    match parse_id(text)? {
        IdText::Uuid(bytes) => Ok(json!({
            "id": uuid::format(&bytes),
            "layout": "uuidv7",
            "created_at": format_unix_ms(uuid::unix_ms(&bytes)),
        })),
        IdText::Snowflake(id) => {
            let decoded =
                schedule.decode(id).map_err(|error| ApiError::bad_request("invalid_id", error.to_string()))?;
            let mut body = json!({
                "id": id.to_string(),
                "layout": decoded.layout.name(),
                "created_at": format_unix_ms(decoded.timestamp.unix_ms()),
                "machine": decoded.machine,
                "sequence": decoded.sequence,
            });
            if let Some(number) = decoded.region_number {
                if let Some(name) = region_names.get(&number) {
                    body["region"] = json!(name);
                }
                body["region_number"] = json!(number);
            }
            Ok(body)
        }
    }
}

pub async fn healthz(State(state): State<AppState>) -> Response {
    let now = state.generator.clock().unix_ms();
    let (status, refusal, leases, clock) = match state.generator.health() {
        Health::Issuing { leases, clock } => (StatusCode::OK, None, leases, clock),
        Health::Refusing { refusal, leases, clock } => (StatusCode::SERVICE_UNAVAILABLE, Some(refusal), leases, clock),
    };
    let fence_ms = state.generator.with_core(|core| core.config().fence_ms);
    let leases: Vec<Value> = leases
        .iter()
        .map(|lease| {
            json!({
                "layout": lease.layout,
                "machine": lease.machine,
                "lease_epoch": lease.epoch,
                "lease_expiry": format_unix_ms(lease.expiry_unix_ms),
                "lease_expiry_ms": lease.expiry_unix_ms,
                "issuing_for_ms": lease.expiry_unix_ms - fence_ms - now,
            })
        })
        .collect();
    let clock = match clock {
        SyncStatus::Synchronized { estimated_error_us } => {
            json!({"sync_check": "required", "synchronized": true, "estimated_error_us": estimated_error_us})
        }
        SyncStatus::Unsynchronized(reason) => {
            json!({"sync_check": "required", "synchronized": false, "reason": reason})
        }
        SyncStatus::NotChecked => json!({"sync_check": "disabled (development only)"}),
    };
    let mut body = json!({
        "status": if refusal.is_none() { "ok" } else { "refusing" },
        "mode": if state.development { "development" } else { "production" },
        "region": &*state.region,
        "region_number": state.region_number,
        "holder": &*state.holder,
        "leases": leases,
        "clock": clock,
    });
    if let Some(refusal) = refusal {
        body["reason"] = json!(refusal.reason());
        body["message"] = json!(refusal.to_string());
        let mut response = (status, Json(body)).into_response();
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(1u64));
        return response;
    }
    (status, Json(body)).into_response()
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    state.generator.refresh_gauges();
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        tracing::error!(%error, "encoding metrics");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::not_found()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_json_is_what_serde_json_would_write() {
        for ids in [vec![], vec![0], vec![97_301_141_913_751_557, u64::MAX >> 1, 10]] {
            let expected = serde_json::to_vec(&json!({ "ids": ids.iter().map(u64::to_string).collect::<Vec<_>>() }));
            assert_eq!(ids_json(&ids), expected.unwrap());
        }
    }

    #[test]
    fn ids_parse_strictly() {
        assert_eq!(parse_id("97301141913751557").unwrap(), IdText::Snowflake(97_301_141_913_751_557));
        assert_eq!(parse_id("0").unwrap(), IdText::Snowflake(0));
        assert_eq!(parse_id(&((1u64 << 63) - 1).to_string()).unwrap(), IdText::Snowflake((1 << 63) - 1));
        for bad in [
            "9223372036854775808",
            "18446744073709551616",
            "99999999999999999999999",
            "-1",
            "+5",
            "1.5",
            "abc",
            "1e3",
            " 1",
            "",
        ] {
            assert!(parse_id(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
