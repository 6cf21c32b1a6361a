//! The HTTP/JSON endpoints of SPEC §4.1. Every handler answers from memory.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idgen::core::{Schedule, format_unix_ms, uuid};
use idgen::{Health, IdGenerator, SyncStatus};
use idgen_server::Caller;
use serde_json::{Value, json};

use crate::body;
use idgen_server::ApiError;

/// Request bodies are tiny (`{"count": 1000}`); anything bigger is refused unread.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
pub use crate::body::MAX_BATCH;

/// What every handler reads, behind one `Arc`: axum clones the state for every request, and one
/// reference count is all that clone should cost.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub generator: Arc<IdGenerator>,
    /// Region names by number, for decoding (until the registry supplies them).
    pub region_names: Arc<std::sync::RwLock<HashMap<u32, String>>>,
    pub region: Arc<str>,
    pub region_number: u32,
    pub holder: Arc<str>,
    /// Development mode (`/healthz` says so).
    pub development: bool,
    /// IDs per second per caller.
    pub quotas: Arc<idgen_server::Quotas>,
    /// What `/metrics` shows, and where every request is counted.
    pub metrics: idgen_server::ServiceMetrics,
}

/// The body, refused beyond `MAX_BODY_BYTES`.
async fn body_bytes(body: Body) -> Result<Bytes, ApiError> {
    idgen_server::read_body(body, MAX_BODY_BYTES).await
}

/// The generator refuses to issue: 503 with the reason as the code, and a `Retry-After` of the
/// time the clock is behind (a second for every other reason).
fn refused(refusal: &idgen::core::Refusal) -> ApiError {
    let retry_after_secs = match refusal {
        idgen::core::Refusal::ClockBehind { behind_ms } => (*behind_ms as u64).div_ceil(1000),
        _ => 1,
    };
    ApiError::unavailable(refusal.reason(), format!("refusing to issue: {refusal}")).retry_after(retry_after_secs)
}

/// `POST /v1/ids` (any other method: 405), answered straight from the request.
pub async fn single_id(state: &AppState, caller: &Caller, request: axum::extract::Request) -> Response {
    if request.method() != axum::http::Method::POST {
        return idgen_server::method_not_allowed("POST");
    }
    create_id(state, caller, request.into_body()).await.unwrap_or_else(IntoResponse::into_response)
}

/// Charges `caller` one ID before its request's body is read: a body sent slowly, or a byte a
/// frame, costs quota before it costs the worker the time to read it.
fn admit_first(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    state.quotas.admit(caller, 1).map_err(ApiError::over_quota)
}

/// Issues `count` IDs (or UUIDs) for `caller` if its quota admits the rest of them (the first was
/// charged by [`admit_first`]); counts what was served.
async fn within_quota<T>(
    state: &AppState,
    caller: &Caller,
    count: u32,
    issue: impl Future<Output = Result<T, idgen::core::Refusal>>,
) -> Result<T, ApiError> {
    if count > 1 {
        state.quotas.admit_rest(caller, count).map_err(ApiError::over_quota)?;
    }
    let issued = issue.await.map_err(|refusal| {
        tracing::warn!(caller = %caller, reason = refusal.reason(), "refusing to issue");
        refused(&refusal)
    })?;
    state.quotas.served(caller, count);
    Ok(issued)
}

async fn create_id(state: &AppState, caller: &Caller, body: Body) -> Result<Response, ApiError> {
    admit_first(state, caller)?;
    body::check_single_body(&body_bytes(body).await?)?;
    let id = within_quota(state, caller, 1, state.generator.next_id()).await?;
    Ok(json_response(id_json(id)))
}

/// A 200 with a JSON body written by hand (the response `Json` would build, without the detour).
fn json_response(body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

/// `{"id":"…","id_num":…}`, what `json!` would write, into one buffer.
pub fn id_json(id: u64) -> Vec<u8> {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(id).as_bytes();
    let mut body = Vec::with_capacity(22 + 2 * digits.len());
    body.extend_from_slice(b"{\"id\":\"");
    body.extend_from_slice(digits);
    body.extend_from_slice(b"\",\"id_num\":");
    body.extend_from_slice(digits);
    body.push(b'}');
    body
}

pub async fn create_batch(State(state): State<AppState>, caller: Caller, body: Body) -> Result<Response, ApiError> {
    admit_first(&state, &caller)?;
    let count = body::count_of(&body_bytes(body).await?, None)?;
    let ids = within_quota(&state, &caller, count, state.generator.next_ids(count)).await?;
    Ok(json_response(ids_json(&ids)))
}

/// `{"ids":["…","…"]}` written straight into one buffer. At the layout cap a worker answers ~4,000
/// of these a second, so this is the batch path's main work. IDs of a batch are mostly
/// consecutive: each entry (`,"digits"`) is the previous one with one added to its digits in
/// place, and only the first of a run (or a carry past its first digit) is formatted in full.
/// Every entry is appended as one fixed-size block and the padding cut off again, so no copy has
/// a length to look up; ten consecutive IDs from one ending in 0 differ only in their
/// last digit: one entry copied ten times, each digit then set in place. Measured on one core:
/// 2.0 ns per ID; patching the entry and then copying it, which reads back a block a byte of
/// which was just written, was 7.2 (a store-forwarding stall each), in fewer instructions (16
/// per ID under callgrind against 29; 35 before groups of ten, 69 before fixed-size blocks).
pub fn ids_json(ids: &[u64]) -> Vec<u8> {
    /// `,"` + at most 20 digits + `"`, padded: the block every entry is appended as.
    const ENTRY: usize = 24;
    fn push(body: &mut Vec<u8>, entry: &[u8; ENTRY], width: usize) {
        body.extend_from_slice(entry);
        body.truncate(body.len() - ENTRY + width);
    }
    const OPEN: &[u8] = b"{\"ids\":";
    if ids.is_empty() {
        return b"{\"ids\":[]}".to_vec();
    }
    let mut body = Vec::with_capacity(OPEN.len() + ids.len() * ENTRY + 2);
    body.extend_from_slice(OPEN);
    let mut formatter = itoa::Buffer::new();
    let mut entry = [0u8; ENTRY];
    entry[..2].copy_from_slice(b",\"");
    let mut digits = 0;
    // The ID one after the last written, if there is one: what the entry can be incremented to.
    let mut next = None;
    let mut i = 0;
    while i < ids.len() {
        let id = ids[i];
        if !(next == Some(id) && increment_decimal(&mut entry[2..2 + digits])) {
            let text = formatter.format(id).as_bytes();
            digits = text.len();
            entry[2..2 + digits].copy_from_slice(text);
            entry[2 + digits] = b'"';
        }
        let (last, width) = (1 + digits, digits + 3);
        let ten = ids
            .get(i..i + 10)
            .filter(|ten| entry[last] == b'0' && (1..10).all(|k| id.checked_add(k as u64) == Some(ten[k])));
        if ten.is_some() {
            let start = body.len();
            for _ in 0..10 {
                push(&mut body, &entry, width);
            }
            // Each last digit set where it lies, so no block is read back after a byte of it
            // was written (a stall per entry when the entry was patched and then copied).
            for k in 1..10 {
                body[start + k * width + last] = b'0' + k as u8;
            }
            entry[last] = b'9';
            i += 10;
        } else {
            push(&mut body, &entry, width);
            i += 1;
        }
        next = ids[i - 1].checked_add(1);
    }
    body[OPEN.len()] = b'[';
    body.extend_from_slice(b"]}");
    body
}

/// Adds one to a decimal number in place; false if it would need one more digit.
fn increment_decimal(digits: &mut [u8]) -> bool {
    for digit in digits.iter_mut().rev() {
        if *digit == b'9' {
            *digit = b'0';
        } else {
            *digit += 1;
            return true;
        }
    }
    false
}

pub async fn create_uuids(State(state): State<AppState>, caller: Caller, body: Body) -> Result<Json<Value>, ApiError> {
    admit_first(&state, &caller)?;
    let count = body::count_of(&body_bytes(body).await?, Some(1))?;
    let uuids = within_quota(&state, &caller, count, state.generator.next_uuids(count)).await?;
    Ok(Json(json!({ "ids": uuids.iter().map(uuid::format).collect::<Vec<_>>() })))
}

/// What a decode path segment is: a 63-bit ID or a UUIDv7.
pub use idgen::core::IdText;

/// An ID in a URL: `idgen_core::parse_id`, its refusal as a 400 `invalid_id`.
pub fn parse_id(text: &str) -> Result<IdText, ApiError> {
    idgen::core::parse_id(text).map_err(|error| ApiError::bad_request("invalid_id", error.to_string()))
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

pub async fn healthz(State(state): State<AppState>, caller: Caller) -> Response {
    let now = state.generator.clock().unix_ms();
    let (status, refusal, leases, clock) = match state.generator.health() {
        Health::Issuing { leases, clock } => (StatusCode::OK, None, leases, clock),
        Health::Refusing { refusal, leases, clock } => (StatusCode::SERVICE_UNAVAILABLE, Some(refusal), leases, clock),
    };
    let (fence_ms, retires_at) = state.generator.with_core(|core| (core.config().fence_ms, core.region_retires_at()));
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
    // On standby (not the home region, before its first layout with a region field) the worker
    // refuses every ID by design: 200, so the load balancer's health check and its alarms stay
    // quiet, with the reason and when the region issues. ID requests still get 503 `schedule`,
    // and clients fail over on it (and move back only to an endpoint whose health says "ok").
    let standby = refusal.as_ref().and_then(|r| r.standby_until());
    let status = if standby.is_some() { StatusCode::OK } else { status };
    let mut body = json!({
        "status": match (&refusal, standby) {
            (None, _) => "ok",
            (Some(_), Some(_)) => "standby",
            (Some(_), None) => "refusing",
        },
        "mode": if state.development { "development" } else { "production" },
        "caller": caller.name(),
        "region": &*state.region,
        "region_number": state.region_number,
        "holder": &*state.holder,
        "leases": leases,
        "clock": clock,
    });
    // A retirement the registry scheduled: issuing until then (from then on, refusing says so).
    if let Some(at) = retires_at.filter(|at| now < *at) {
        body["region_retires_at"] = json!(format_unix_ms(at));
    }
    if let Some(refusal) = refusal {
        body["reason"] = json!(refusal.reason());
        body["message"] = json!(refusal.to_string());
    }
    if let Some(issues_from) = standby {
        body["issues_from"] = json!(format_unix_ms(issues_from));
        body["issues_from_ms"] = json!(issues_from);
    }
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(1u64));
    }
    response
}

/// The worker's OpenAPI 3.1 document, checked in as `docs/openapi/worker.json` (served by
/// `idgen_server::openapi_route`; a test holds it to the router's routes).
pub const OPENAPI: &str = include_str!("../../../docs/openapi/worker.json");

pub async fn not_found() -> ApiError {
    ApiError::not_found(
        "not_found",
        "no such endpoint; see GET /healthz, POST /v1/ids, POST /v1/ids:batch, GET /v1/ids/{id}/decode, POST /v1/uuids, \
         GET /metrics, GET /openapi.json",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::body::{check_single_body, count_of, read_count, read_no_fields};

    proptest::proptest! {
        /// The typed fast paths answer exactly as the general reading: the same count, or the
        /// same error code and message, for bodies near and far from the valid ones.
        #[test]
        fn typed_bodies_answer_as_the_general_reading(
            body in proptest::prop_oneof![
                r#"[ \t\n]*\{[ ]*("count"[ ]*:[ ]*(-?[0-9]{1,5}(\.[0-9])?|1e3|"7"|null|true|\[1\])[ ]*(,[ ]*"(count|x)"[ ]*:[ ]*[0-9])?)?[ ]*\}[ ]*"#,
                r#"\[[0-9]{0,4}\]|"[a-z]*"|[0-9]{1,4}|null|\{|\}|"#,
                ".{0,12}",
                "[ \t\n\r\x0b\x0c]{0,2}\\{\\}[ \t\n\r\x0b\x0c]{0,2}",
            ],
            default in proptest::option::of(1u64..=3),
        ) {
            let bytes = body.as_bytes();
            proptest::prop_assert_eq!(count_of(bytes, default), read_count(bytes, default), "{}", body);
            proptest::prop_assert_eq!(check_single_body(bytes), read_no_fields(bytes), "{}", body);
        }
    }

    /// Found by the `request_body` fuzz target: a form feed is ASCII whitespace but not JSON
    /// whitespace, and `\f{}\f` was taken as `{}` by the single-ID fast path.
    #[test]
    fn only_json_whitespace_surrounds_a_body() {
        // Found by schemathesis: a body of only whitespace is not JSON (only no body at all is
        // "nothing").
        for bytes in [&b"\x0c{}\x0c"[..], b"\x0c", b"\x0b{}", b"{}\x0c", b"\n", b" \r\n"] {
            let refused = check_single_body(bytes).unwrap_err();
            assert_eq!(refused.code, "invalid_json", "{bytes:?}");
            assert_eq!(count_of(bytes, Some(1)).unwrap_err().code, "invalid_json", "{bytes:?}");
        }
        for bytes in [&b" \t\r\n{}\n"[..], b""] {
            assert_eq!(check_single_body(bytes), Ok(()), "{bytes:?}");
        }
    }

    #[test]
    fn id_json_is_what_serde_json_would_write() {
        for id in [0, 7, 97_301_141_913_751_557, u64::MAX >> 1] {
            let expected = serde_json::to_vec(&json!({ "id": id.to_string(), "id_num": id })).unwrap();
            assert_eq!(id_json(id), expected);
        }
    }

    #[test]
    fn ids_json_is_what_serde_json_would_write() {
        let consecutive: Vec<u64> = (97_301_141_913_751_550..97_301_141_913_752_560).collect();
        let carries = vec![8, 9, 10, 11, 99, 100, 101, 999, 1_000, 9_999_999, 10_000_000, 10_000_001];
        // Ten from one ending in 0, except one: a gap, a repeat, a step back, a wrap past u64::MAX.
        let broken_tens = vec![
            vec![10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21],
            vec![10, 11, 12, 13, 14, 15, 16, 17, 18, 18, 19],
            vec![100, 101, 102, 103, 104, 105, 106, 107, 108, 100],
            vec![u64::MAX - 5, u64::MAX - 4, u64::MAX - 3, u64::MAX - 2, u64::MAX - 1, u64::MAX, 0, 1, 2, 3],
            (0..10).chain(0..10).chain(20..29).collect(),
        ];
        let cases =
            [vec![], vec![0], vec![97_301_141_913_751_557, u64::MAX >> 1, 10], consecutive, carries, vec![5, 4, 5, 6]];
        for ids in cases.into_iter().chain(broken_tens) {
            let expected = serde_json::to_vec(&json!({ "ids": ids.iter().map(u64::to_string).collect::<Vec<_>>() }));
            assert_eq!(ids_json(&ids), expected.unwrap());
        }
    }

    proptest::proptest! {
        /// Runs of consecutive IDs with jumps between them, across digit lengths and up to u64::MAX.
        #[test]
        fn ids_json_is_what_serde_json_writes_for_any_runs(
            runs in proptest::collection::vec(
                (proptest::prop_oneof![0u64..200, 990u64..1_010, 99_999_990u64..100_000_010, 9_999_999_999_999_999_990u64..10_000_000_000_000_000_010, (u64::MAX - 30)..=u64::MAX], 1usize..40),
                0..8,
            )
        ) {
            let ids: Vec<u64> =
                runs.iter().flat_map(|&(start, len)| (0..len as u64).map_while(move |i| start.checked_add(i))).collect();
            let expected = serde_json::to_vec(&json!({ "ids": ids.iter().map(u64::to_string).collect::<Vec<_>>() }));
            proptest::prop_assert_eq!(ids_json(&ids), expected.unwrap());
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
