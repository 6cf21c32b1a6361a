//! The HTTP/JSON endpoints of SPEC §7.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use idgen_server::{ApiError, Caller, Quotas};

use crate::access::{Access, Forbidden, Operation};
use crate::body::{BatchBody, CreateBody, parse_format, parse_internal_id};
use crate::cache::{Cached, MappingCache};
use crate::check::{Gate, Verdict};
use crate::format::{self, Format, Keyring, RandomSource, RandomSourceMetrics};
use crate::store::{CreateError, Mapping, PublicIdStore, ResolveError};
use crate::types::{Parsed, PublicType, Types};

const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_BATCH: usize = 1_000;

/// PostgreSQL's SQLSTATE for a statement cancelled, by `statement_timeout` among others.
const QUERY_CANCELED: &str = "57014";

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<PublicIdStore>,
    /// Stored mappings already seen, asked before `store` by resolves and lookups, filled by
    /// every mapping created or found (`[cache]`).
    pub cache: Arc<MappingCache>,
    /// `None` when no KMS key is configured: the encrypted format is then unavailable.
    pub keyring: Option<Arc<Keyring>>,
    /// Public IDs created or resolved per second, per caller (a batch of N counts N).
    pub quotas: Arc<Quotas>,
    /// The formats this deployment offers (`formats` in the configuration).
    pub formats: Arc<[Format]>,
    /// Who may create, resolve and look up (`[access]`), checked before any other work.
    pub access: Arc<Access>,
    /// Where opaque and UUIDv7 public IDs draw their random bits (the OS CSPRNG in service).
    pub random: Arc<dyn RandomSource>,
    /// Creates refused because `random` failed.
    pub random_failures: Arc<RandomSourceMetrics>,
    /// The configured types of public IDs (`[types]`), whose names prefix typed IDs.
    pub types: Arc<Types>,
    /// The keyed check of opaque public IDs: made into each new one, asked of each resolve the
    /// cache missed before any read ([`crate::check`]).
    pub gate: Arc<Gate>,
}

/// The one answer for unknown, malformed and forged public IDs alike.
fn no_such_public_id() -> ApiError {
    ApiError::not_found("not_found", "no such public ID")
}

/// The caller is not listed for this operation (and format): 403, before any other work.
fn forbidden(refused: Forbidden) -> ApiError {
    ApiError::forbidden("forbidden", refused.message)
}

/// The random source failed: no public ID is made from bits that may be predictable.
fn random_unavailable(format: Format, error: format::RandomUnavailable) -> ApiError {
    tracing::error!(%error, format = format.as_str(), "public-ID random source");
    ApiError::unavailable(
        "random_source_unavailable",
        "the random source public IDs are drawn from is unavailable; nothing was created",
    )
}

/// 503 with `Retry-After`, whatever the database did: no free connection within the acquire
/// timeout, a statement past its timeout, or no answer at all.
fn storage(error: sqlx::Error) -> ApiError {
    tracing::error!(%error, "public-ID storage");
    let message = match &error {
        sqlx::Error::PoolTimedOut => "the database is busy: no connection to it was free in time",
        sqlx::Error::Database(e) if e.code().as_deref() == Some(QUERY_CANCELED) => {
            "the database is slow: it did not answer in time"
        }
        _ => "the database is unavailable",
    };
    ApiError::unavailable("storage_unavailable", message)
}

/// [`storage`] for a resolve or a lookup, whose reads of the primary may also all be taken: the
/// same 503, said as such and not logged (a flood would fill the log).
fn resolve_refused(error: ResolveError) -> ApiError {
    match error {
        ResolveError::Storage(error) => storage(error),
        ResolveError::FallbacksBusy => ApiError::unavailable(
            "storage_unavailable",
            "too many resolves and lookups are waiting for the primary database: retry",
        ),
    }
}

/// Refuses `caller` 403 unless `[access]` lets it do `operation` (in `format`; with none, in
/// some format).
fn authorize(state: &AppState, caller: &Caller, operation: Operation, format: Option<Format>) -> Result<(), ApiError> {
    state.access.check(caller, operation, format).map_err(forbidden)
}

/// Admits `n` public IDs for `caller`, counting them as served if admitted.
fn admit(state: &AppState, caller: &Caller, n: u32) -> Result<(), ApiError> {
    state.quotas.admit(caller, n).map_err(ApiError::over_quota)?;
    state.quotas.served(caller, n);
    Ok(())
}

/// Charges `caller` one public ID before its request's body is read: a body sent slowly, or a
/// byte a frame, costs quota before it costs the service the time to read it.
fn admit_first(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    state.quotas.admit(caller, 1).map_err(ApiError::over_quota)
}

/// Admits the rest of a request for `n` public IDs charged one by [`admit_first`], counting the
/// `n` as served if admitted.
fn admit_rest(state: &AppState, caller: &Caller, n: u32) -> Result<(), ApiError> {
    state.quotas.admit_rest(caller, n).map_err(ApiError::over_quota)?;
    state.quotas.served(caller, n);
    Ok(())
}

/// Creates (or finds) the public IDs of `ids` in `format`, of type `public_type` (whose format is
/// `format`): 409 `type_mismatch` for an internal ID whose mapping exists with another type.
pub async fn map_ids(
    state: &AppState,
    ids: &[u64],
    format: Format,
    public_type: Option<PublicType>,
) -> Result<Vec<Mapping>, ApiError> {
    // A format this deployment does not offer is the caller's to change: a 4xx that says so.
    let unavailable = |message: String| ApiError::bad_request("format_unavailable", message);
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
                    let public_id = keyring.encrypt(id).ok_or_else(|| {
                        ApiError::unavailable("format_unavailable", "no data key is loaded for the encrypted format")
                    })?;
                    Ok(Mapping { internal_id: id, format, public_id, type_number: None, created: false })
                })
                .collect()
        }
        Format::Opaque | Format::Uuidv7 => {
            let (random, gate) = (state.random.as_ref(), state.gate.as_ref());
            let now_ms = idgen::system_unix_ms();
            let asked = public_type.map(|t| t.number);
            let make = move || match format {
                Format::Uuidv7 => format::new_uuidv7(random, idgen::system_unix_ms()),
                _ => gate.new_opaque(random, asked, idgen::system_unix_ms()),
            };
            let mappings =
                state.store.create_batch(ids, format, asked, &make, now_ms).await.map_err(|error| match error {
                    CreateError::Storage(error) => storage(error),
                    CreateError::Random(error) => {
                        state.random_failures.failed(format);
                        random_unavailable(format, error)
                    }
                })?;
            for m in &mappings {
                state.cache.remember(m.internal_id, format, &m.public_id, m.type_number);
            }
            let other: Vec<String> = mappings
                .iter()
                .filter(|m| m.type_number != asked)
                .map(|m| format!("{} ({})", m.internal_id, type_name(&state.types, m.type_number)))
                .collect();
            if !other.is_empty() {
                return Err(ApiError::conflict(
                    "type_mismatch",
                    format!(
                        "the {} public IDs of these internal IDs exist with another type than {} (a mapping never \
                     changes): {}",
                        format.as_str(),
                        type_name(&state.types, asked),
                        other.join(", ")
                    ),
                ));
            }
            Ok(mappings)
        }
    }
}

/// A type number as messages name it: the type's name, "no type", or a number no longer
/// configured.
fn type_name(types: &Types, type_number: Option<u16>) -> String {
    match type_number {
        None => "no type".into(),
        Some(number) => match types.name_of(number) {
            Some(name) => format!("type {name}"),
            None => format!("type number {number} (no longer configured)"),
        },
    }
}

/// A mapping as the API answers it: its public ID as handed out (typed: `name_` and the 26
/// characters), and its type's name when it has one. Only called with a mapping whose type is
/// configured (the create checked it is the one asked).
fn mapping_json(types: &Types, m: &Mapping) -> Value {
    let public_id = types.text(m.format, m.type_number, &m.public_id).unwrap_or_else(|| m.public_id.clone());
    let mut json =
        json!({"public_id": public_id, "internal_id": m.internal_id.to_string(), "format": m.format.as_str()});
    if let Some(name) = m.type_number.and_then(|number| types.name_of(number)) {
        json["type"] = json!(name);
    }
    json
}

/// The format and type a create or lookup asks for: `type` (a configured type's name) implies
/// its format, and a `format` beside it must be that one; without a type, `format` (default
/// opaque).
fn format_and_type(
    types: &Types,
    format: Option<&str>,
    public_type: Option<&str>,
) -> Result<(Format, Option<PublicType>), ApiError> {
    let public_type = match public_type {
        None => None,
        Some(name) => Some(types.named(name).ok_or_else(|| {
            let message = match types.names()[..] {
                [] => format!("unknown type {name:?}: this service has no types of public IDs"),
                ref names => format!("unknown type {name:?}; this service's types: {}", names.join(", ")),
            };
            ApiError::bad_request("unknown_type", message)
        })?),
    };
    match (format, public_type) {
        (None, Some(public_type)) => Ok((public_type.format, Some(public_type))),
        (format, public_type) => {
            let format = parse_format(format)?;
            if let Some(t) = public_type.filter(|t| t.format != format) {
                return Err(ApiError::bad_request(
                    "type_format_mismatch",
                    format!(
                        "the type's public IDs are {}, not {}: leave format out, or ask for {}",
                        t.format.as_str(),
                        format.as_str(),
                        t.format.as_str()
                    ),
                ));
            }
            Ok((format, public_type))
        }
    }
}

pub async fn create(State(state): State<Arc<AppState>>, caller: Caller, body: Body) -> Result<Response, ApiError> {
    authorize(&state, &caller, Operation::Create, None)?;
    admit_first(&state, &caller)?;
    let body: CreateBody = idgen_server::read_json(body, MAX_BODY_BYTES).await?;
    let (format, public_type) = format_and_type(&state.types, body.format.as_deref(), body.public_type.as_deref())?;
    authorize(&state, &caller, Operation::Create, Some(format))?;
    state.access.check_create_answer(&caller, format).map_err(forbidden)?;
    admit_rest(&state, &caller, 1)?;
    let id = parse_internal_id(&body.internal_id)?;
    let mapping = map_ids(&state, &[id], format, public_type).await?.remove(0);
    // Encrypted IDs are computed, never created: always 200.
    let status = if mapping.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(mapping_json(&state.types, &mapping))).into_response())
}

pub async fn create_batch(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&state, &caller, Operation::Create, None)?;
    admit_first(&state, &caller)?;
    let body: BatchBody = idgen_server::read_json(body, MAX_BODY_BYTES).await?;
    let (format, public_type) = format_and_type(&state.types, body.format.as_deref(), body.public_type.as_deref())?;
    authorize(&state, &caller, Operation::Create, Some(format))?;
    state.access.check_create_answer(&caller, format).map_err(forbidden)?;
    let ids = &body.internal_ids;
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ApiError::bad_request(
            "invalid_count",
            format!("internal_ids must hold 1 to {MAX_BATCH} IDs, not {}", ids.len()),
        ));
    }
    let mut parsed: Vec<u64> = ids.iter().map(parse_internal_id).collect::<Result<_, _>>()?;
    admit_rest(&state, &caller, ids.len() as u32)?;
    parsed.sort_unstable();
    parsed.dedup();
    let mappings = map_ids(&state, &parsed, format, public_type).await?;
    let by_id: std::collections::HashMap<u64, &Mapping> = mappings.iter().map(|m| (m.internal_id, m)).collect();
    let public_ids: Vec<Created> =
        ids.iter().map(|v| Created::of(&state.types, by_id[&parse_internal_id(v).expect("parsed above")])).collect();
    Ok(Json(Batch { public_ids }).into_response())
}

/// A batch create's answer, serialized as it is (a JSON map per mapping cost a batch's answer
/// about ten allocations an ID).
#[derive(serde::Serialize)]
struct Batch<'a> {
    public_ids: Vec<Created<'a>>,
}

/// One mapping of a batch create's answer: [`mapping_json`]'s fields and `created` (a test
/// holds the two to the same JSON).
#[derive(serde::Serialize)]
struct Created<'a> {
    public_id: std::borrow::Cow<'a, str>,
    internal_id: Decimal,
    format: &'static str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    public_type: Option<&'a str>,
    created: bool,
}

impl<'a> Created<'a> {
    fn of(types: &'a Types, m: &'a Mapping) -> Created<'a> {
        use std::borrow::Cow;
        let typed = m.type_number.and_then(|_| types.text(m.format, m.type_number, &m.public_id));
        Created {
            public_id: typed.map_or(Cow::Borrowed(m.public_id.as_str()), Cow::Owned),
            internal_id: Decimal(m.internal_id),
            format: m.format.as_str(),
            public_type: m.type_number.and_then(|number| types.name_of(number)),
            created: m.created,
        }
    }
}

/// An internal ID as the API writes it: a decimal string (JSON numbers lose precision above
/// 2^53), without an intermediate `String`.
struct Decimal(u64);

impl serde::Serialize for Decimal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(itoa::Buffer::new().format(self.0))
    }
}

pub async fn resolve(State(state): State<Arc<AppState>>, caller: Caller, uri: Uri) -> Result<Response, ApiError> {
    resolve_uri(&state, &caller, &uri).await
}

/// [`resolve`] of the public ID in `uri`'s path, for `caller`: what the route answers, and what
/// the service's own fast path for it ([`crate::App`]) answers.
pub async fn resolve_uri(state: &AppState, caller: &Caller, uri: &Uri) -> Result<Response, ApiError> {
    authorize(state, caller, Operation::Resolve, None)?;
    // The text is read once, into its format (from its shape, or its type's configuration:
    // never from whether it exists, so a refusal for a format tells the caller nothing it did not
    // send), its bytes, and the type its prefix names.
    let public_id = path_segment(uri);
    let parsed = public_id.as_deref().and_then(|text| state.types.parse(text));
    match &parsed {
        Some(Parsed::Encrypted) => authorize(state, caller, Operation::Resolve, Some(Format::Encrypted))?,
        Some(Parsed::Stored { format, .. }) => authorize(state, caller, Operation::Resolve, Some(*format))?,
        None => {}
    }
    admit(state, caller, 1)?;
    let (Some(public_id), Some(parsed)) = (public_id, parsed) else { return Err(no_such_public_id()) };
    let (internal, type_number) = match parsed {
        Parsed::Encrypted => match state.keyring.as_ref().and_then(|k| k.decrypt(&public_id)) {
            Some(internal) => (internal, None),
            None => return Err(no_such_public_id()),
        },
        Parsed::Stored { format, bytes, type_number } => {
            match resolve_stored(state, caller, format, &bytes, type_number).await? {
                // A typed ID resolves only with its own type's prefix, an untyped one only without
                // any: anything else is the same 404 as an unknown ID.
                Some((internal, found_type)) if found_type == type_number => (internal, type_number),
                _ => return Err(no_such_public_id()),
            }
        }
    };
    let public_type = type_number.and_then(|number| state.types.name_of(number));
    Ok(resolved(&public_id, internal, public_type))
}

/// The last segment of a resolve's path (`/v1/public-ids/{public_id}`), percent-decoded as
/// axum's `Path` would, `None` where that is not UTF-8. Read from the URI rather than through
/// `Path<String>`: a text that needs no decoding (every public ID) is borrowed, not copied, on the
/// service's busiest call.
fn path_segment(uri: &Uri) -> Option<std::borrow::Cow<'_, str>> {
    let path = uri.path();
    let raw = resolve_segment(path).unwrap_or_else(|| path.rsplit('/').next().unwrap_or_default());
    if !raw.contains('%') {
        return Some(raw.into());
    }
    percent_encoding::percent_decode_str(raw).decode_utf8().ok()
}

/// The public ID of a path that the resolve route matches: one non-empty segment after
/// `/v1/public-ids/` (still percent-encoded).
pub fn resolve_segment(path: &str) -> Option<&str> {
    let segment = path.strip_prefix("/v1/public-ids/")?;
    (!segment.is_empty() && !segment.contains('/')).then_some(segment)
}

/// A resolve's answer, `{"public_id":…,"internal_id":"…"}` with `"type"` when it has one: the
/// busiest answer the service gives, written into one buffer of its exact size. The public ID is
/// one the service parsed and the type a configured name, so neither needs escaping; a text that
/// would is written by serde_json all the same.
fn resolved(public_id: &str, internal_id: u64, public_type: Option<&str>) -> Response {
    let plain = |text: &str| text.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    if !plain(public_id) || !public_type.is_none_or(plain) {
        let mut answer = json!({"public_id": public_id, "internal_id": internal_id.to_string()});
        if let Some(public_type) = public_type {
            answer["type"] = public_type.into();
        }
        return Json(answer).into_response();
    }
    let mut digits = itoa::Buffer::new();
    let internal_id = digits.format(internal_id);
    let parts: [&str; 5] = [r#"{"public_id":""#, public_id, r#"","internal_id":""#, internal_id, "\""];
    let typed: [&str; 3] = [r#","type":""#, public_type.unwrap_or_default(), "\""];
    let typed = if public_type.is_some() { &typed[..] } else { &[] };
    let length = parts.iter().chain(typed).map(|part| part.len()).sum::<usize>() + 1;
    let mut body = Vec::with_capacity(length);
    for part in parts.iter().chain(typed) {
        body.extend_from_slice(part.as_bytes());
    }
    body.push(b'}');
    let json = axum::http::HeaderValue::from_static("application/json");
    ([(axum::http::header::CONTENT_TYPE, json)], axum::body::Bytes::from(body)).into_response()
}

/// The internal ID and type number of a stored (opaque or UUIDv7) public ID: from the cache,
/// else from the database (read for `caller`, within its share of the primary's reads), and then
/// kept in the cache. An opaque ID the keyed check finds forged ([`Gate::judge`], for the type its
/// prefix names), or a UUIDv7 dated ahead, is not found without a read; a miss of an ID that can
/// no longer be made ([`Gate::miss_is_final`]) is remembered, so its replays read nothing.
///
/// The database's future is boxed, on a miss only: held in place it made every resolve's future
/// over a kilobyte, which the allocator serves from its slow path, cache hits included.
async fn resolve_stored(
    state: &AppState,
    caller: &Caller,
    format: Format,
    public_id: &[u8; 16],
    type_number: Option<u16>,
) -> Result<Option<(u64, Option<u16>)>, ApiError> {
    match state.cache.resolve(format, public_id) {
        Some(Cached::Found(internal_id, type_number)) => return Ok(Some((internal_id, type_number))),
        Some(Cached::Missing) => return Ok(None),
        None => {}
    }
    let verdict = state.gate.judge(format, public_id, type_number);
    if verdict == Verdict::Forged {
        return Ok(None);
    }
    let found = Box::pin(state.store.resolve_for(caller.name(), format, public_id)).await.map_err(resolve_refused)?;
    match found {
        Some((internal_id, type_number)) => state.cache.remember_resolved(internal_id, format, public_id, type_number),
        None if state.gate.miss_is_final(verdict) => state.cache.remember_missing(format, public_id),
        None => {}
    }
    Ok(found)
}

/// The stored public ID (without a type's prefix) and type number of `internal_id` in `format`
/// (opaque or UUIDv7): from the cache, else from the database, and then kept in the cache.
async fn lookup_stored(
    state: &AppState,
    caller: &Caller,
    internal_id: u64,
    format: Format,
) -> Result<Option<(String, Option<u16>)>, ApiError> {
    if let Some(found) = state.cache.lookup(internal_id, format) {
        return Ok(Some(found));
    }
    let found = state.store.lookup_for(caller.name(), internal_id, format).await.map_err(resolve_refused)?;
    if let Some((public_id, type_number)) = &found {
        state.cache.remember(internal_id, format, public_id, *type_number);
    }
    Ok(found)
}

#[derive(serde::Deserialize)]
pub struct FormatQuery {
    format: Option<String>,
    #[serde(rename = "type")]
    public_type: Option<String>,
}

pub async fn lookup(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FormatQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &caller, Operation::Lookup, None)?;
    let Path(text) = path
        .map_err(|_| ApiError::bad_request("invalid_internal_id", "the internal ID in the path is not valid UTF-8"))?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let (format, public_type) = format_and_type(&state.types, query.format.as_deref(), query.public_type.as_deref())?;
    authorize(&state, &caller, Operation::Lookup, Some(format))?;
    admit(&state, &caller, 1)?;
    let id = parse_internal_id(&Value::String(text))?;
    let none = |message: String| ApiError::not_found("not_found", message);
    let mapping = match format {
        Format::Encrypted => map_ids(&state, &[id], format, None).await?.remove(0),
        stored => {
            let Some((public_id, type_number)) = lookup_stored(&state, &caller, id, stored).await? else {
                return Err(none(format!("internal ID {id} has no {} public ID", stored.as_str())));
            };
            let asked = public_type.map(|t| t.number);
            if asked.is_some() && asked != type_number {
                return Err(none(format!(
                    "internal ID {id} has no {} public ID of {}: it has one of {}",
                    stored.as_str(),
                    type_name(&state.types, asked),
                    type_name(&state.types, type_number)
                )));
            }
            if type_number.is_some_and(|number| state.types.name_of(number).is_none()) {
                return Err(none(format!(
                    "internal ID {id}'s {} public ID is of {}: its text has no prefix to show",
                    stored.as_str(),
                    type_name(&state.types, type_number)
                )));
            }
            Mapping { internal_id: id, format, public_id, type_number, created: false }
        }
    };
    Ok(Json(mapping_json(&state.types, &mapping)))
}

pub async fn healthz(State(state): State<Arc<AppState>>) -> Json<Value> {
    let encrypted = state.keyring.as_ref().map(|k| json!({"key_versions": k.versions()}));
    Json(json!({"status": "ok", "encrypted": encrypted}))
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}

/// The service's OpenAPI 3.1 document, checked in as `docs/openapi/public-ids.json` (served by
/// `idgen_server::openapi_route`; a test holds it to the router).
pub const OPENAPI: &str = include_str!("../../../docs/openapi/public-ids.json");

/// [`OPENAPI`] as this deployment serves it: a `type` is one of its `[types]`, an `enum`, or with
/// none configured a schema nothing matches, so that no request the served document allows is
/// refused `unknown_type` (a client generated from it, or schemathesis, learns the names).
pub fn served_openapi(types: &Types) -> String {
    let mut document: Value = serde_json::from_str(OPENAPI).expect("the checked-in document is JSON");
    let schema = &mut document["components"]["schemas"]["TypeName"];
    let names = types.names();
    *schema = match names.is_empty() {
        false => {
            let mut schema = schema.take();
            schema["enum"] = json!(names);
            schema["example"] = json!(names[0]);
            schema["description"] = json!(format!(
                "A type of public IDs this deployment configures ([types]): {}. It implies its stored format; a \
                 `format` beside it that is not the type's is 400 `type_format_mismatch`.",
                names.join(", ")
            ));
            schema
        }
        true => json!({
            "not": {},
            "description": "This deployment configures no types of public IDs ([types]): a `type` is 400 `unknown_type`."
        }),
    };
    // Pretty, as the document in docs/openapi is: read by people with curl as much as by tools.
    serde_json::to_string_pretty(&document).expect("a JSON value prints") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resolve's answer written by hand is the JSON serde_json writes, typed or not, and a
    /// text that would need escaping is escaped.
    #[tokio::test]
    async fn a_resolve_answer_is_the_json_of_its_fields() {
        let cases = [
            ("01h455vb4pex5vsknk084sn02q", 0, None),
            ("order_01h455vb4pex5vsknk084sn02q", u64::MAX, Some("order")),
            ("0188e3c4-8f2a-7b3c-9d4e-5f6a7b8c9d0e", 120542881919451136, Some("user_account")),
            ("a\"b\\c", 7, Some("t\"")),
            ("é ", 8, None),
        ];
        for (public_id, internal_id, public_type) in cases {
            let response = resolved(public_id, internal_id, public_type);
            assert_eq!(response.headers()[axum::http::header::CONTENT_TYPE], "application/json");
            let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
            let mut expected = json!({"public_id": public_id, "internal_id": internal_id.to_string()});
            if let Some(public_type) = public_type {
                expected["type"] = public_type.into();
            }
            assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), expected, "{}", String::from_utf8_lossy(&body));
        }
    }

    /// A batch create's answer for a mapping is what a single create answers for it, with
    /// `created`: typed or not, each stored format, internal IDs to `u64::MAX`.
    #[test]
    fn a_batch_answer_is_the_mapping_json_and_created() {
        use std::collections::BTreeMap;

        use crate::types::TypeSection;
        let section = BTreeMap::from([
            ("order".to_owned(), TypeSection { number: 1, format: "opaque".into() }),
            ("user".to_owned(), TypeSection { number: 2, format: "uuidv7".into() }),
        ]);
        let types = Types::from_config(&section, &[Format::Opaque, Format::Uuidv7]).unwrap();
        let opaque = format::crockford_encode(&[9u8; 16]);
        let uuid = idgen::core::uuid::format(&idgen::core::uuid::new_v7(1_700_000_000_000, 1, 2));
        for (internal_id, format, public_id, type_number, created) in [
            (0, Format::Opaque, &opaque, None, true),
            (u64::MAX, Format::Opaque, &opaque, Some(1), false),
            (7, Format::Uuidv7, &uuid, None, false),
            (8, Format::Uuidv7, &uuid, Some(2), true),
        ] {
            let m = Mapping { internal_id, format, public_id: public_id.clone(), type_number, created };
            let mut expected = mapping_json(&types, &m);
            expected["created"] = json!(created);
            let written = serde_json::to_value(Created::of(&types, &m)).unwrap();
            assert_eq!(written, expected);
        }
    }

    /// The public ID is the path's last segment, decoded as axum's `Path` decodes it.
    #[test]
    fn the_public_id_is_the_decoded_last_segment() {
        let segment = |path: &str| path_segment(&path.parse().unwrap()).map(|text| text.into_owned());
        assert_eq!(segment("/v1/public-ids/01h455vb4pex5vsknk084sn02q").as_deref(), Some("01h455vb4pex5vsknk084sn02q"));
        assert_eq!(segment("/v1/public-ids/order%5F01h455?x=1").as_deref(), Some("order_01h455"));
        assert_eq!(segment("/v1/public-ids/%C3%A9").as_deref(), Some("é"));
        assert_eq!(segment("/v1/public-ids/%FF"), None, "not UTF-8");
        assert_eq!(segment("/v2/public-ids/x").as_deref(), Some("x"), "the last segment of any path");
    }
}
