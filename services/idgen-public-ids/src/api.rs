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

use crate::body::{self, only_fields, parse_format, parse_internal_id};
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
    /// The formats this deployment offers (`formats` in the configuration).
    pub formats: Arc<[Format]>,
}

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after_secs: Option<u64>,
}

impl From<body::BodyError> for ApiError {
    fn from(error: body::BodyError) -> Self {
        ApiError::bad(error.0)
    }
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
    Ok(body::parse_object(&bytes)?)
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
    // A format this deployment does not offer is the caller's to change: a 4xx that says so.
    let unavailable = |message: String| ApiError {
        status: StatusCode::BAD_REQUEST,
        code: "format_unavailable",
        message,
        retry_after_secs: None,
    };
    if !state.formats.contains(&format) {
        let offered: Vec<&str> = state.formats.iter().map(|f| f.as_str()).collect();
        return Err(unavailable(format!(
            "this service does not offer the {} format; it offers {}",
            format.as_str(),
            offered.join(", ")
        )));
    }
    match format {
        Format::Encrypted => {
            let keyring = state.keyring.as_ref().ok_or_else(|| {
                unavailable(
                    "this service offers no encrypted format: it has no data key (a [kms] key, or \
                     development_key_file in development)"
                        .into(),
                )
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

/// The service's OpenAPI 3.1 document, checked in as `docs/openapi/public-ids.json` (served by
/// `idgen_server::openapi_route`; a test holds it to the router).
pub const OPENAPI: &str = include_str!("../../../docs/openapi/public-ids.json");
