//! The registry's HTTP/JSON endpoints (SPEC §5). Reads are open; writes need an operator token
//! (`Authorization: Bearer …`) and are recorded with the operator's name.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idgen_core::{EPOCH_UNIX_MS, Layout, MAX_TIMESTAMP, format_unix_ms, parse_rfc3339_ms};
use idgen_json::body::{BodyError, not_null, present, read_object};
use idgen_server::{ApiError, Caller, read_body, read_json};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::store::{Region, RegistryError, RegistryStore, Reported, ScheduleView, ScheduledLayout};

const MAX_BODY_BYTES: usize = 4 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<RegistryStore>,
    /// The operators known by bearer token (by the token's hash).
    pub operators: Arc<crate::operators::OperatorTokens>,
    /// Callers whose client certificate, of the operator CA, makes them operators (reloaded on
    /// SIGHUP).
    pub certificate_operators: Arc<crate::operators::CertifiedNames>,
    /// Writes refused for want of an operator, by reason.
    pub refusals: Arc<WriteRefusals>,
    /// `/healthz`'s probe of the database.
    pub health: Arc<HealthProbe>,
    pub horizon_lead_ms: i64,
    /// A retirement takes effect this long after it is asked for, at the earliest (ms).
    pub retire_grace_ms: i64,
    /// `regions add` hands out no number this long after the database's `init` (ms).
    pub new_registry_quiet_ms: i64,
    /// Callers that may record a lease table's identity the first time (the fleet's hosts;
    /// reloaded on SIGHUP).
    pub lease_table_recorders: Arc<crate::operators::CertifiedNames>,
    pub now: fn() -> i64,
}

/// 503: the database did not answer in time (or at all); try again in a second.
fn storage_unavailable() -> ApiError {
    ApiError::unavailable("storage_unavailable", "the registry's database is unavailable")
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        use ApiError as E;
        match error {
            RegistryError::NameExists(_) => E::conflict("name_exists", error.to_string()),
            RegistryError::NoNumberLeft { .. } => E::conflict("no_number_left", error.to_string()),
            RegistryError::UnknownRegion(_) => E::not_found("unknown_region", error.to_string()),
            RegistryError::HomeRegionInUse(_) => E::conflict("home_region_in_use", error.to_string()),
            RegistryError::RetirePending { .. } => E::conflict("retire_pending", error.to_string()),
            RegistryError::AlreadyRetired { .. } => E::conflict("already_retired", error.to_string()),
            RegistryError::NoRetirementPending(_) => E::conflict("no_retirement_pending", error.to_string()),
            RegistryError::LayoutExists(_) => E::conflict("layout_exists", error.to_string()),
            RegistryError::UnknownLayout(_) => E::not_found("unknown_layout", error.to_string()),
            RegistryError::LeaseTableMoved { .. } => E::conflict("lease_table_moved", error.to_string()),
            RegistryError::LeaseTableInUse { .. } => E::conflict("lease_table_in_use", error.to_string()),
            RegistryError::LeaseTableIdentity { .. } => E::conflict("lease_table_identity", error.to_string()),
            RegistryError::ScheduleConflict { .. } => E::conflict("schedule_conflict", error.to_string()),
            RegistryError::NumbersInUse { .. } => E::conflict("numbers_in_use", error.to_string()),
            RegistryError::NewRegistryQuiet { until_ms, .. } => {
                let wait = until_ms.saturating_sub(idgen::system_unix_ms()).max(0) / 1000 + 1;
                E::unavailable("registry_quiet", error.to_string()).retry_after(wait as u64)
            }
            RegistryError::Storage(_)
            | RegistryError::Silent(_)
            | RegistryError::Invalid(_)
            | RegistryError::NotARegistry(_) => {
                tracing::error!(%error, "registry storage");
                storage_unavailable()
            }
        }
    }
}

/// Whether a browser sent this request for another site's page. A browser holding an operator's
/// client certificate sends it along on any request, a cross-site form post included, so such a
/// request is refused whatever it carries. Browsers name where a request comes from
/// (`Sec-Fetch-Site`, or at least `Origin`); the CLI and curl send neither.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return false };
    let authority = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, rest)| rest);
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    authority.is_none() || authority != host
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// `idgen_registry_writes_refused_total{reason}`: writes refused for want of an operator.
/// `not_an_operator_certificate` is a certificate naming a listed operator that the operator CA
/// did not issue: someone holding a callers' certificate trying to pass for an operator.
#[derive(Default)]
pub struct WriteRefusals {
    refused: Family<ReasonLabel, Counter>,
}

impl WriteRefusals {
    /// Every reason, so each series exists at 0 from the start.
    pub const REASONS: [&str; 4] = ["cross_site", "no_credentials", "unknown_token", "not_an_operator_certificate"];

    pub fn register(self: &Arc<Self>, registry: &mut prometheus_client::registry::Registry) {
        for reason in Self::REASONS {
            let _ = self.refused.get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "idgen_registry_writes_refused",
            "Writes refused for want of an operator (401/403), by reason",
            self.refused.clone(),
        );
    }

    fn refuse(&self, reason: &'static str, error: ApiError) -> ApiError {
        debug_assert!(Self::REASONS.contains(&reason), "{reason} is not in WriteRefusals::REASONS");
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
        error
    }

    /// How many writes were refused for `reason` (tests).
    pub fn count(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&ReasonLabel { reason }).get()
    }
}

/// The operator's name: the caller of a certificate of the operator CA listed in
/// `certificate_operators`, or the name of the configured token the request carries. A listed
/// name on any other certificate is refused (403) and counted, token or not: that certificate
/// passes for an operator.
fn operator(state: &AppState, headers: &HeaderMap, caller: &Caller) -> Result<String, ApiError> {
    let refusals = &state.refusals;
    if cross_site(headers) {
        return Err(refusals.refuse(
            "cross_site",
            ApiError::forbidden(
                "cross_site",
                "operator requests are not taken from another site's page; use this registry's /console, the CLI or \
                 curl",
            ),
        ));
    }
    let unauthorized = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "writes need an operator: Authorization: Bearer <token>, or a client certificate of an operator",
        )
    };
    if state.certificate_operators.contains(caller.name()) {
        if !caller.has_operator_certificate() {
            tracing::warn!(
                caller = caller.name(),
                "a certificate naming an operator, not issued by the operator CA: write refused"
            );
            return Err(refusals.refuse(
                "not_an_operator_certificate",
                ApiError::forbidden(
                    "not_an_operator_certificate",
                    "this client certificate names an operator but was not issued by the operators' CA",
                ),
            ));
        }
        if headers.get(header::AUTHORIZATION).is_none() {
            return Ok(caller.name().to_owned());
        }
    }
    let Some(token) =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(refusals.refuse("no_credentials", unauthorized()));
    };
    state.operators.operator(token).ok_or_else(|| refusals.refuse("unknown_token", unauthorized()))
}

/// `POST /v1/regions`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddRegionBody {
    name: String,
    /// A lease table name per layout.
    #[serde(default, deserialize_with = "not_null")]
    lease_tables: Option<BTreeMap<String, String>>,
}

/// `POST /v1/regions/{name}:retire`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetireBody {
    #[serde(default, deserialize_with = "not_null")]
    confirm: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    at: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    now: Option<bool>,
}

/// `POST /v1/regions/{name}:cancel-retire`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelRetireBody {
    #[serde(default, deserialize_with = "not_null")]
    confirm: Option<String>,
}

/// `POST /v1/regions/{name}:move-lease-table`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveLeaseTableBody {
    #[serde(default, deserialize_with = "not_null")]
    confirm: Option<String>,
    layout: String,
    from: String,
    to: String,
    /// The adopted table's genesis (`table_id`); without it, its next `idgen leases init` records it.
    #[serde(default, deserialize_with = "not_null")]
    table_id: Option<String>,
}

/// `POST /v1/regions/{name}:record-lease-table`: which table the region's table is, by its
/// genesis (`idgen leases init` sends it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordLeaseTableBody {
    #[serde(default, deserialize_with = "not_null")]
    confirm: Option<String>,
    layout: String,
    table: String,
    table_id: String,
}

/// A genesis `table_id`: 16 to 64 lowercase hexadecimal digits (`leases init` draws 32).
fn table_id(id: &str) -> Result<&str, ApiError> {
    if (16..=64).contains(&id.len()) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Ok(id);
    }
    Err(ApiError::bad_request(
        "invalid_table_id",
        "\"table_id\" must be a lease table's genesis id: 16-64 lowercase hexadecimal digits (`idgen leases init` \
         prints it)",
    ))
}

/// `POST /v1/layouts`: the bits and `from_ms` read by `idgen-json` (a whole number however
/// written).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddLayoutBody {
    name: String,
    region_bits: Value,
    machine_bits: Value,
    sequence_bits: Value,
    #[serde(default, deserialize_with = "not_null")]
    from: Option<String>,
    #[serde(default, deserialize_with = "present")]
    from_ms: Option<Value>,
}

/// Region names: 1–63 characters of a–z, 0–9 and '-', starting with a letter.
pub fn valid_region_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn region_json(region: &Region) -> Value {
    let mut value = json!({
        "name": region.name,
        "number": region.number,
        "status": region.status.as_str(),
        "created_at": format_unix_ms(region.created_at_ms),
    });
    if let Some(retired) = region.retired_at_ms {
        value["retired_at"] = json!(format_unix_ms(retired));
    }
    if let Some(retires) = region.retires_at_ms {
        value["retires_at"] = json!(format_unix_ms(retires));
    }
    if !region.lease_tables.is_empty() {
        let tables: Map<String, Value> = region
            .lease_tables
            .iter()
            .map(|(layout, table)| {
                let mut entry = json!({ "table": table.table });
                if let Some(from) = &table.moved_from {
                    entry["moved_from"] = json!(from);
                }
                if let Some(id) = &table.table_id {
                    entry["table_id"] = json!(id);
                }
                (layout.clone(), entry)
            })
            .collect();
        value["lease_tables"] = Value::Object(tables);
    }
    value
}

/// Lease table names: 3–200 of A–Z a–z 0–9 `-` `_` `.` (what DynamoDB and the SQLite store both
/// take), neither an audit table's (`…-audit`) nor the SQLite file's genesis table.
pub fn valid_table_name(name: &str) -> bool {
    (3..=200).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.ends_with("-audit")
        && name != "idgen-genesis"
}

/// A lease table name of field `field`, or why not.
fn table_name<'a>(name: &'a str, field: &str) -> Result<&'a str, ApiError> {
    if valid_table_name(name) {
        return Ok(name);
    }
    Err(ApiError::bad_request(
        "invalid_table_name",
        format!("{field} must be a lease table name: 3-200 of A-Z a-z 0-9 - _ ., not ending in -audit, not {name:?}"),
    ))
}

fn epoch_ms_text(ms: u64) -> String {
    format_unix_ms(ms.min(MAX_TIMESTAMP + 1) as i64 + EPOCH_UNIX_MS)
}

fn layouts_json(view: &ScheduleView) -> Value {
    let layouts: Vec<Value> = view
        .layouts
        .iter()
        .map(|l| {
            json!({
                "name": l.layout.name(),
                "region_bits": l.layout.region_bits(),
                "machine_bits": l.layout.machine_bits(),
                "sequence_bits": l.layout.sequence_bits(),
                "from": epoch_ms_text(l.from_ms),
                "from_ms": l.from_ms,
            })
        })
        .collect();
    json!({
        "layouts": layouts,
        "horizon": epoch_ms_text(view.horizon_ms),
        "horizon_ms": view.horizon_ms,
        "home_region": view.home_region,
        "registry_id": view.registry_id,
    })
}

pub async fn list_regions(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let now = (state.now)();
    let regions = state.store.regions(now).await?;
    let view = state.store.schedule(now, state.horizon_lead_ms).await?;
    let in_use = state.store.numbers_in_use(now).await?;
    let total = view.region_capacity(now);
    // The numbers used, counted once each: work in the regions, not in the capacity times them.
    let used: std::collections::BTreeSet<u32> =
        regions.iter().map(|r| r.number).filter(|number| *number < total).collect();
    let left = total as usize - used.len();
    let in_use: Vec<Value> = in_use
        .iter()
        .map(|held| {
            json!({
                "number": held.number, "region": held.region, "registry_id": held.registry_id,
                "until": format_unix_ms(held.until_ms), "reporter": held.reporter,
                "last_reported": format_unix_ms(held.last_at_ms),
            })
        })
        .collect();
    Ok(Json(json!({
        "regions": regions.iter().map(region_json).collect::<Vec<_>>(),
        "numbers_left": left,
        "numbers_total": total,
        "numbers_in_use_elsewhere": in_use,
    })))
}

/// `POST /v1/numbers-in-use`: what a generator following another registry reports at each
/// refresh whose answer it refuses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NumberInUseBody {
    registry_id: String,
    region: String,
    region_number: Value,
    issues_until_ms: Value,
}

/// `POST /v1/numbers-in-use` (open to every caller, as reads are: the generators that report hold
/// no operator credential; each request counts against the caller's quota). A report withholds a
/// number that is not handed out yet, for no longer than the horizon lead: the most a hostile
/// caller can do is delay `regions add` of one number by one lead, and every report is logged
/// with its caller.
pub async fn report_number_in_use(
    State(state): State<AppState>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let body: NumberInUseBody = read_json(body, MAX_BODY_BYTES).await?;
    let now = (state.now)();
    let region = body.region.as_str();
    if !valid_region_name(region) {
        return Err(ApiError::bad_request("invalid_region_name", format!("{region:?} is not a region name")));
    }
    let registry_id = body.registry_id.as_str();
    if !(1..=64).contains(&registry_id.len()) || !registry_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::bad_request("invalid_registry_id", "\"registry_id\" must be 1-64 letters and digits"));
    }
    // Any number a layout's region field can hold: one the schedule has no layout for yet is
    // withheld all the same, against a layout added later that has it.
    let numbers = 1u64 << idgen_core::layout::MAX_REGION_BITS;
    let number = idgen_json::whole_number(&body.region_number).ok().filter(|n| *n < numbers).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_region_number",
            format!("\"region_number\" must be a region number, 0 to {}", numbers - 1),
        )
    })? as u32;
    let until = idgen_json::whole_number(&body.issues_until_ms)
        .ok()
        .filter(|ms| *ms <= idgen_json::MAX_SAFE_INTEGER)
        .and_then(|ms| i64::try_from(ms).ok())
        .ok_or_else(|| ApiError::bad_request("invalid_time", "\"issues_until_ms\" must be a time in Unix ms"))?;
    let reported = state
        .store
        .report_number_in_use(number, region, registry_id, until, caller.name(), now, state.horizon_lead_ms)
        .await?;
    let answer = match reported {
        Reported::Withheld { until_ms } => {
            tracing::error!(
                reporter = caller.name(),
                region,
                number,
                registry_id,
                until = %format_unix_ms(until_ms),
                "a generator following another registry issues under this region number: withheld from `regions add` \
                 (this registry was started over or restored; runbooks/registry-started-over.md)"
            );
            json!({"withheld": true, "number": number, "until": format_unix_ms(until_ms), "until_ms": until_ms})
        }
        Reported::Conflict { region: holder } => {
            tracing::error!(
                reporter = caller.name(),
                region,
                number,
                holder,
                registry_id,
                "TWO REGIONS ISSUE UNDER ONE NUMBER: a generator following another registry issues under {number} as \
                 {region}, and this registry handed it to {holder} (runbooks/registry-started-over.md)"
            );
            json!({"withheld": false, "number": number, "conflict": holder})
        }
        Reported::Nothing { why } => json!({"withheld": false, "number": number, "why": why}),
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

pub async fn add_region(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let actor = operator(&state, &headers, &caller)?;
    let body: AddRegionBody = read_json(body, MAX_BODY_BYTES).await?;
    let name = body.name.as_str();
    if !valid_region_name(name) {
        return Err(ApiError::bad_request(
            "invalid_region_name",
            format!("region name {name:?} must be 1–63 of a–z, 0–9, '-', starting with a letter"),
        ));
    }
    let tables = body.lease_tables.unwrap_or_default();
    for (layout, table) in &tables {
        table_name(table, &format!("lease_tables.{layout}"))?;
    }
    let now = (state.now)();
    let capacity = state.store.schedule(now, state.horizon_lead_ms).await?.region_capacity(now);
    let quiet = state.new_registry_quiet_ms;
    let region = state.store.add_region_quietly(name, capacity, &tables, quiet, &actor, now).await?;
    tracing::info!(%actor, name, number = region.number, "region added");
    Ok((StatusCode::CREATED, Json(region_json(&region))).into_response())
}

/// `POST /v1/regions/{name}:retire` and `POST /v1/regions/{name}:cancel-retire` (one route: a
/// capture cannot share its path segment with a literal suffix, so the suffix is taken off here).
pub async fn region_action(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(segment) = path
        .map_err(|_| ApiError::bad_request("invalid_region_name", "the region name in the path is not valid UTF-8"))?;
    let (name, action) = match segment.rsplit_once(':') {
        Some((name, action @ ("retire" | "cancel-retire" | "move-lease-table" | "record-lease-table"))) => {
            (name, action)
        }
        _ => {
            return Err(ApiError::not_found(
                "not_found",
                "the region actions are POST /v1/regions/{name}:retire, POST /v1/regions/{name}:cancel-retire, \
                 POST /v1/regions/{name}:move-lease-table and POST /v1/regions/{name}:record-lease-table",
            ));
        }
    };
    // The fleet's hosts record their table's identity at their first boot with their own
    // certificate (`lease_table_recorders`), where an operator may do anything.
    let recorder = action == "record-lease-table"
        && !cross_site(&headers)
        && headers.get(header::AUTHORIZATION).is_none()
        && state.lease_table_recorders.contains(caller.name());
    let actor = match recorder {
        true => format!("{} (lease_table_recorders)", caller.name()),
        false => operator(&state, &headers, &caller)?,
    };
    if !valid_region_name(name) {
        return Err(ApiError::bad_request("invalid_region_name", format!("{name:?} is not a region name")));
    }
    let bytes = read_body(body, MAX_BODY_BYTES).await?;
    // A body refused for its shape says what to send.
    let shaped = |refused: BodyError| {
        ApiError::from(refused)
            .map_message(|message| format!("{message}: send {{\"confirm\": {name:?}}}; nothing was changed"))
    };
    let now = (state.now)();
    if action == "move-lease-table" {
        let body: MoveLeaseTableBody = read_object(&bytes).map_err(shaped)?;
        confirmed(body.confirm.as_deref(), name)?;
        if body.layout.is_empty() {
            return Err(ApiError::bad_request("unknown_layout", "\"layout\" names a layout, like \"v2\""));
        }
        let (from, to) = (table_name(&body.from, "from")?, table_name(&body.to, "to")?);
        if from == to {
            return Err(ApiError::bad_request(
                "same_table",
                "\"from\" and \"to\" name the same table: nothing to move",
            ));
        }
        let layout = body.layout.as_str();
        let id = body.table_id.as_deref().map(table_id).transpose()?;
        let region = state.store.move_lease_table(name, layout, from, to, id, &actor, now).await?;
        tracing::warn!(%actor, name, layout, from, to, "lease table moved: the region's generators claim in it once it is adopted");
        return Ok(Json(region_json(&region)).into_response());
    }
    if action == "record-lease-table" {
        let body: RecordLeaseTableBody = read_object(&bytes).map_err(shaped)?;
        confirmed(body.confirm.as_deref(), name)?;
        if body.layout.is_empty() {
            return Err(ApiError::bad_request("unknown_layout", "\"layout\" names a layout, like \"v2\""));
        }
        let table = table_name(&body.table, "table")?;
        let id = table_id(&body.table_id)?;
        let layout = body.layout.as_str();
        let (region, recorded) = state.store.record_lease_table(name, layout, table, id, &actor, now).await?;
        if recorded {
            tracing::info!(%actor, name, layout, table, table_id = id, "lease table identity recorded");
        }
        let mut answer = region_json(&region);
        answer["recorded"] = json!(recorded);
        return Ok(Json(answer).into_response());
    }
    if action == "cancel-retire" {
        let body: CancelRetireBody = read_object(&bytes).map_err(shaped)?;
        confirmed(body.confirm.as_deref(), name)?;
        let region = state.store.cancel_retire(name, &actor, now).await?;
        tracing::info!(%actor, name, number = region.number, "region retirement cancelled");
        return Ok(Json(region_json(&region)).into_response());
    }
    let body: RetireBody = read_object(&bytes).map_err(shaped)?;
    confirmed(body.confirm.as_deref(), name)?;
    let at_once = body.now.unwrap_or(false);
    let earliest = now.saturating_add(state.retire_grace_ms);
    let at_ms = match (body.at, at_once) {
        (Some(_), true) => {
            return Err(ApiError::bad_request("conflicting_fields", "give \"at\" or \"now\": true, not both"));
        }
        (None, true) => None,
        (None, false) => Some(earliest),
        (Some(at), false) => {
            let at = parse_rfc3339_ms(&at).ok_or_else(|| {
                ApiError::bad_request("invalid_time", "\"at\" must be a UTC time like 2029-01-01T00:00:00Z")
            })?;
            if at < earliest {
                return Err(ApiError::bad_request(
                    "retire_too_soon",
                    format!(
                        "\"at\" {} is earlier than the retire grace allows ({} s from now): the earliest is {}; \
                         for a region that is already dead, \"now\": true",
                        format_unix_ms(at),
                        state.retire_grace_ms / 1000,
                        format_unix_ms(earliest)
                    ),
                ));
            }
            Some(at)
        }
    };
    let region = state.store.retire_region(name, at_ms, &actor, now, state.horizon_lead_ms).await?;
    match region.retires_at_ms {
        Some(at) => {
            tracing::info!(%actor, name, number = region.number, retires_at = %format_unix_ms(at), "region retirement scheduled");
            Ok((StatusCode::ACCEPTED, Json(region_json(&region))).into_response())
        }
        None => {
            tracing::info!(%actor, name, number = region.number, "region retired; its number is never reused");
            Ok(Json(region_json(&region)).into_response())
        }
    }
}

/// A region action names its region twice, in the path and in the body's `"confirm"`: a typo in
/// either is refused rather than acted on.
fn confirmed(confirm: Option<&str>, name: &str) -> Result<(), ApiError> {
    match confirm {
        Some(confirm) if confirm == name => Ok(()),
        Some(confirm) => Err(ApiError::bad_request(
            "confirm_mismatch",
            format!(
                "the path names region {name:?} and \"confirm\" names {confirm:?}: they must be the same; nothing was \
                 changed"
            ),
        )),
        None => Err(ApiError::bad_request(
            "unconfirmed",
            format!("name the region a second time, in the body: {{\"confirm\": {name:?}}}; nothing was changed"),
        )),
    }
}

pub async fn get_layouts(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let view = state.store.schedule((state.now)(), state.horizon_lead_ms).await?;
    Ok(Json(layouts_json(&view)))
}

pub async fn add_layout(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let actor = operator(&state, &headers, &caller)?;
    let body: AddLayoutBody = read_json(body, MAX_BODY_BYTES).await?;
    let name = body.name.as_str();
    let bits = |field: &str, value: &Value| -> Result<u8, ApiError> {
        idgen_json::whole_number(value).ok().filter(|b| *b <= 22).map(|b| b as u8).ok_or_else(|| {
            ApiError::bad_request("invalid_layout", format!("\"{field}\" must be an integer from 0 to 22"))
        })
    };
    let layout = Layout::new(
        name,
        bits("region_bits", &body.region_bits)?,
        bits("machine_bits", &body.machine_bits)?,
        bits("sequence_bits", &body.sequence_bits)?,
    )
    .map_err(|e| ApiError::bad_request("invalid_layout", e.to_string()))?;
    let invalid_time = |message: &str| ApiError::bad_request("invalid_time", message);
    let from_ms = match (body.from, body.from_ms) {
        (Some(from), None) => {
            let unix = parse_rfc3339_ms(&from)
                .ok_or_else(|| invalid_time("\"from\" must be a UTC time like 2029-01-01T00:00:00Z"))?;
            u64::try_from(unix - EPOCH_UNIX_MS).map_err(|_| invalid_time("\"from\" is before the epoch 2026-01-01"))?
        }
        (None, Some(ms)) => idgen_json::whole_number(&ms)
            .map_err(|_| invalid_time("\"from_ms\" must be a non-negative integer (ms since 2026-01-01)"))?,
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "conflicting_fields",
                "give exactly one of \"from\" (RFC 3339, UTC) or \"from_ms\" (ms since the epoch), not both",
            ));
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "missing_field",
                "give exactly one of \"from\" (RFC 3339, UTC) or \"from_ms\" (ms since the epoch)",
            ));
        }
    };
    let added = state
        .store
        .add_layout(ScheduledLayout { layout, from_ms }, &actor, (state.now)(), state.horizon_lead_ms)
        .await?;
    tracing::info!(%actor, name, from_ms, "layout scheduled");
    // The layout is committed: whatever happens to the read below, the answer is 201 (a 503 here
    // would send the operator to retry into a 409).
    let created = match state.store.schedule((state.now)(), state.horizon_lead_ms).await {
        Ok(view) => {
            let mut created = layouts_json(&view);
            created["added"] = json!(added.layout.name());
            created
        }
        Err(error) => {
            tracing::warn!(%error, "layout added, but the schedule could not be read back for the answer");
            json!({ "added": added.layout.name(), "from_ms": added.from_ms })
        }
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

pub async fn audit(State(state): State<AppState>, caller: Caller, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    operator(&state, &headers, &caller)?;
    let rows = state.store.audit_log(1000).await?;
    Ok(Json(
        json!({"writes": rows.iter().map(|r| json!({"at": format_unix_ms(r.at_ms), "actor": r.actor, "action": r.action, "detail": r.detail})).collect::<Vec<_>>()}),
    ))
}

pub async fn healthz(State(state): State<AppState>) -> Response {
    match state.health.check(&state.store).await {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(()) => storage_unavailable().into_response(),
    }
}

/// `/healthz`'s look at the database: one probe at a time, and its answer kept for a second, so
/// that health checks at any rate (the route is exempt from quotas: a load balancer must reach
/// it) cost the database at most one query a second, and never queue behind one another.
#[derive(Default)]
pub struct HealthProbe {
    last: std::sync::Mutex<Option<(std::time::Instant, Result<(), ()>)>>,
    probing: tokio::sync::Mutex<()>,
    probes: Counter,
}

impl HealthProbe {
    /// How long one probe's answer stands.
    const FRESH: std::time::Duration = std::time::Duration::from_secs(1);
    /// While a probe runs, how old an answer may still stand for the database now.
    const STALE: std::time::Duration = std::time::Duration::from_secs(5);

    pub fn register(self: &Arc<Self>, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "idgen_registry_health_probes",
            "Database probes made for /healthz: at most one a second, whatever the rate of health checks",
            self.probes.clone(),
        );
    }

    fn last_within(&self, age: std::time::Duration) -> Option<Result<(), ()>> {
        let last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref().filter(|(at, _)| at.elapsed() < age).map(|(_, answer)| *answer)
    }

    async fn check(&self, store: &RegistryStore) -> Result<(), ()> {
        if let Some(answer) = self.last_within(Self::FRESH) {
            return answer;
        }
        let _probing = match self.probing.try_lock() {
            Ok(probing) => probing,
            // Another check probes right now: the last answer while it still stands, else that
            // probe's (bounded by the database timeouts).
            Err(_) => match self.last_within(Self::STALE) {
                Some(answer) => return answer,
                None => self.probing.lock().await,
            },
        };
        if let Some(answer) = self.last_within(Self::FRESH) {
            return answer;
        }
        self.probes.inc();
        let answer =
            store.ping().await.map_err(|error| tracing::error!(%error, "the registry's database probe failed"));
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((std::time::Instant::now(), answer));
        answer
    }
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}

/// The registry's OpenAPI 3.1 document, checked in as `docs/openapi/registry.json` (served by
/// `idgen_server::openapi_route`; a test holds it to the router).
pub const OPENAPI: &str = include_str!("../../docs/openapi/registry.json");
