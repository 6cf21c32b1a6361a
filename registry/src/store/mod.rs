//! The registry's storage: PostgreSQL in production, SQLite as the embedded default, through
//! each database's own driver ([`Pool`], the services' one storage design). Each room is written
//! once, in SQL both databases accept, and compiled for each driver (the `postgres` and `sqlite`
//! modules below hold the same files); the same store test suite runs on both
//! (`tests/store.rs`).
//!
//! - `mod.rs` (here): the types, opening and initializing the database, and the store's
//!   operations, each handed to its room on the database's driver.
//! - [`regions`](postgres::regions): numbers, names, retirements and lease tables.
//! - [`schedule`](postgres::schedule): the layouts and the horizon, and what `init` publishes.
//! - [`audit`](postgres::audit): the record every write appends.
//!
//! Never: reuses a region number, deletes a row, changes a layout once added, moves the horizon
//! back, or initializes a database when asked to open it.

use std::collections::BTreeMap;

use idgen_core::{Layout, MAX_TIMESTAMP};
use idgen_server::database::{Pool, PoolSettings, RequestTimeouts, Schema};
use idgen_server::on_pool;
use thiserror::Error;

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/registry/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/registry/postgres");

mod postgres;
mod sqlite;

/// Calls `room::operation(pool, args…)` on the driver of the store's pool.
macro_rules! on_driver {
    ($on:expr, $room:ident::$operation:ident($($arg:expr),* $(,)?)) => {
        match $on {
            Pool::Postgres(pool) => postgres::$room::$operation(pool, $($arg),*).await,
            Pool::Sqlite(pool) => sqlite::$room::$operation(pool, $($arg),*).await,
        }
    };
}

/// A never-exhausted horizon: past the last representable timestamp.
pub const OPEN_HORIZON_MS: u64 = MAX_TIMESTAMP + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionStatus {
    Active,
    Retired,
}

impl RegionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RegionStatus::Active => "active",
            RegionStatus::Retired => "retired",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub name: String,
    pub number: u32,
    pub status: RegionStatus,
    pub created_at_ms: i64,
    pub retired_at_ms: Option<i64>,
    /// A retirement scheduled and not reached yet: until then the region is active, issues and
    /// can have the retirement cancelled.
    pub retires_at_ms: Option<i64>,
    /// The lease table the region's generators claim in, per layout (empty where an answer does
    /// not carry them: a retirement's).
    pub lease_tables: BTreeMap<String, LeaseTable>,
}

/// A region's lease table under one layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTable {
    pub table: String,
    /// The table it replaced, when an operator moved the region to this one.
    pub moved_from: Option<String>,
    /// Which table of that name it is: the `table_id` of its genesis, recorded by its first
    /// `idgen leases init` (or given with the move that named it). `None` until then.
    pub table_id: Option<String>,
}

/// A scheduled layout: in force from `from_ms` (ms since the idgen epoch) on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledLayout {
    pub layout: Layout,
    pub from_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleView {
    pub layouts: Vec<ScheduledLayout>,
    /// ms since the idgen epoch; no cutover before it.
    pub horizon_ms: u64,
    pub home_region: String,
    /// The registry's identity, made once at `init`.
    pub registry_id: String,
}

impl ScheduleView {
    /// Region numbers every layout in force now or later can carry: a number handed out today
    /// must fit the current layout as well as the scheduled ones. (Layouts without a region
    /// field are the home region's alone and do not count; with none but those, 1.)
    pub fn region_capacity(&self, now_unix_ms: i64) -> u32 {
        let now = since_epoch(now_unix_ms);
        let current = self.layouts.iter().rposition(|l| l.from_ms <= now).unwrap_or(0);
        self.layouts[current..]
            .iter()
            .map(|l| l.layout.region_bits())
            .filter(|bits| *bits > 0)
            .min()
            .map_or(1, |bits| 1u32 << bits)
    }

    /// The first layout without region bits (only the home region issues under it) that is in
    /// force at `now_unix_ms` or starts later, and when it ends (`None`: it does not).
    pub fn home_only_layout(&self, now_unix_ms: i64) -> Option<(&ScheduledLayout, Option<u64>)> {
        let now = since_epoch(now_unix_ms);
        self.layouts.iter().enumerate().find_map(|(i, entry)| {
            let end = self.layouts.get(i + 1).map(|next| next.from_ms);
            (entry.layout.region_bits() == 0 && end.is_none_or(|end| end > now)).then_some((entry, end))
        })
    }
}

/// Unix ms as ms since the idgen epoch (0 before it).
fn since_epoch(unix_ms: i64) -> u64 {
    (unix_ms - idgen_core::EPOCH_UNIX_MS).max(0) as u64
}

/// A region number that generators following another registry report issuing under
/// (`POST /v1/numbers-in-use`): `regions add` hands it out to no one until `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberInUse {
    pub number: u32,
    /// The region the reporter issues as.
    pub region: String,
    /// The registry the reporter follows (not this one).
    pub registry_id: String,
    /// Unix ms: the reporter's copy lets it issue until then (capped at the report's time plus
    /// this registry's horizon lead).
    pub until_ms: i64,
    /// Who reported it last (the connection's caller).
    pub reporter: String,
    pub last_at_ms: i64,
}

/// What a report of a number in use did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// Withheld from `regions add` until then (Unix ms).
    Withheld { until_ms: i64 },
    /// Nothing to withhold: the reporter follows this registry, or this registry has the number
    /// under the reporter's own region name, or the reported time is past.
    Nothing { why: String },
    /// This registry has already handed the number to another region: two regions issue under
    /// it now. Nothing can be withheld; an operator must act (runbooks/registry-started-over.md).
    Conflict { region: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub detail: String,
}

#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("a region named {0:?} already exists")]
    NameExists(String),
    #[error("no region number is left: all {capacity} numbers have been used (retired numbers are never reused)")]
    NoNumberLeft { capacity: u32 },
    #[error("no active region named {0:?}")]
    UnknownRegion(String),
    /// Retiring the home region while a layout only it issues under is in force or scheduled.
    #[error("{0}")]
    HomeRegionInUse(String),
    #[error("region {name} already retires at {}: cancel that (cancel-retire) to choose another time, or retire it now", idgen_core::format_unix_ms(*at_ms))]
    RetirePending { name: String, at_ms: i64 },
    #[error("region {name} was retired at {}; a retirement cannot be undone once its time has come", idgen_core::format_unix_ms(*at_ms))]
    AlreadyRetired { name: String, at_ms: i64 },
    #[error("region {0} has no retirement pending")]
    NoRetirementPending(String),
    #[error("no layout named {0:?} is scheduled")]
    UnknownLayout(String),
    #[error(
        "region {name}'s lease table for layout {layout} is {current}, not {from}: another operator moved it, or \
         the command names the wrong table; nothing was changed"
    )]
    LeaseTableMoved { name: String, layout: String, from: String, current: String },
    #[error(
        "region {name}'s lease table {table} for layout {layout} is recorded as table {recorded} (its genesis when it \
         was first initialized), and this one's genesis is {offered}: it is another table of the same name (another \
         AWS region's, another host's SQLite file), whose generators would hand out numbers the recorded table's \
         holders hold. Nothing was recorded. To move the region to it, adopt it (`idgen leases adopt --from-table \
         <the recorded table>`) and move the region (`idgen regions move-lease-table`, runbooks/lease-table-restore.md)"
    )]
    LeaseTableIdentity { name: String, layout: String, table: String, recorded: String, offered: String },
    #[error("region {name} already uses {table} for layout {other}: every layout has a table of its own")]
    LeaseTableInUse { name: String, table: String, other: String },
    #[error("a layout named {0:?} is already scheduled")]
    LayoutExists(String),
    /// Every number left is reported in use by generators of a registry this one replaced.
    #[error(
        "no region number can be handed out now: the numbers left ({numbers:?}) are reported in use by generators \
         still following another registry (this one was started over, or restored from a backup), until {}. \
         Handing one out would make two regions issue the same IDs (runbooks/registry-started-over.md)",
        idgen_core::format_unix_ms(*until_ms)
    )]
    NumbersInUse { numbers: Vec<u32>, until_ms: i64 },
    /// A registry made moments ago: generators of a registry it replaced may not have reported yet.
    #[error(
        "this registry's database was initialized at {}: until {} it hands out no region number, so that every \
         generator still following a registry this one replaced (a database made again, a backup restored) has \
         refreshed and reported the number it issues under (new_registry_quiet_ms; runbooks/registry-started-over.md)",
        idgen_core::format_unix_ms(*initialized_at_ms),
        idgen_core::format_unix_ms(*until_ms)
    )]
    NewRegistryQuiet { initialized_at_ms: i64, until_ms: i64 },
    #[error("{what}")]
    ScheduleConflict { what: String },
    /// The database is not a registry's to serve from (empty, half-made, another service's, or
    /// naming another home region); the message says what was found and what to run.
    #[error("{0}")]
    NotARegistry(String),
    #[error("storage: {0}")]
    Storage(#[from] sqlx::Error),
    /// The database did not answer a call within the store's deadline.
    #[error("storage: the database did not answer within {0:?}")]
    Silent(std::time::Duration),
    #[error("storage holds an invalid row: {0}")]
    Invalid(String),
}

/// What an empty registry starts with.
#[derive(Debug, Clone)]
pub struct InitialSchedule {
    pub layouts: Vec<ScheduledLayout>,
    pub home_region: String,
}

impl InitialSchedule {
    /// SPEC §1: v1 from the epoch, v2 from 2028-01-01T00:00:00Z.
    pub fn spec_default(home_region: &str) -> Self {
        InitialSchedule {
            layouts: vec![
                ScheduledLayout { layout: Layout::v1(), from_ms: 0 },
                ScheduledLayout { layout: Layout::v2(), from_ms: idgen_core::DEFAULT_V2_FROM },
            ],
            home_region: home_region.to_owned(),
        }
    }
}

#[derive(Clone)]
pub struct RegistryStore {
    pool: Pool,
    /// How long one call may wait for the database, whatever it does: the acquire timeout and
    /// twice the statement timeout ([`RequestTimeouts::call_deadline`]). The statement timeout
    /// is the server's; a database that goes silent (a failover, packets dropped) answers
    /// nothing, and without this a call would wait for TCP to give up, with callers queued
    /// behind it.
    deadline: std::time::Duration,
}

/// What a region row is read from (`regions::region_row`).
const REGION_COLUMNS: &str = "name, number, status, created_at_ms, retired_at_ms, retires_at_ms";

impl RegistryStore {
    /// The database pool's open connections and how many of them are idle (for `/metrics`).
    pub fn pool_connections(&self) -> (u32, usize) {
        self.pool.connections()
    }

    /// Development: connects (`postgres://…` or `sqlite://…`), initializes the database if it is
    /// new ([`Self::initialize`]) and opens it. Production starts with [`Self::open`] instead,
    /// which never initializes.
    pub async fn connect(url: &str, initial: &InitialSchedule) -> Result<Self, RegistryError> {
        Self::connect_waiting(url, initial, idgen::lease::open_lock::DEFAULT_OPEN_TIMEOUT).await
    }

    /// [`Self::connect`], waiting up to `within` for other processes opening the same SQLite
    /// file ([`idgen::lease::open_lock`]).
    pub async fn connect_waiting(
        url: &str,
        initial: &InitialSchedule,
        within: std::time::Duration,
    ) -> Result<Self, RegistryError> {
        Self::connect_waiting_with(url, initial, within, RequestTimeouts::default()).await
    }

    /// [`Self::connect_waiting`], with how long a request waits for the database.
    pub async fn connect_waiting_with(
        url: &str,
        initial: &InitialSchedule,
        within: std::time::Duration,
        timeouts: RequestTimeouts,
    ) -> Result<Self, RegistryError> {
        Self::initialize(url, initial, within).await?;
        Self::open_with(url, &initial.home_region, within, timeouts).await
    }

    /// `idgen registry init`: applies the migrations and, on a new database, publishes the home
    /// region and the first layouts. Idempotent: on a registry's database it only applies the
    /// migrations still pending, and fails if that database names another home region. Refuses
    /// a database holding tables that are not a registry's.
    pub async fn initialize(
        url: &str,
        initial: &InitialSchedule,
        within: std::time::Duration,
    ) -> Result<Initialized, RegistryError> {
        // Held until the file is set up and seeded.
        let _one_opener = open_lock(url, within).await?;
        let connection = Pool::connect_one(url).await?;
        let migrated = connection.migrate(&SCHEMA).await;
        let seeded = match migrated {
            Ok(()) => on_driver!(&connection, schedule::seed(initial)),
            Err(error) => Err(RegistryError::NotARegistry(format!("{error:#}"))),
        };
        connection.close().await;
        seeded
    }

    /// `idgen registry init --owner-url`: gives the role the registry runs as exactly the
    /// privileges it uses (`SCHEMA`), connected as the role that owns the schema.
    pub async fn grant_runtime(owner_url: &str, role: &str, password: Option<&str>) -> Result<(), RegistryError> {
        let connection = Pool::connect_one(owner_url).await?;
        let granted = connection.grant(&SCHEMA, role, password).await;
        connection.close().await;
        granted.map_err(|error| RegistryError::NotARegistry(format!("granting {role} its privileges: {error:#}")))
    }

    /// Opens a registry's database to serve from it. Never initializes: an empty database, one
    /// with migrations pending, another service's, or one naming another home region is refused
    /// ([`RegistryError::NotARegistry`], saying what to run). A registry started on an empty
    /// database would hand out region numbers from 0 again: two regions with one number.
    pub async fn open(url: &str, home_region: &str, within: std::time::Duration) -> Result<Self, RegistryError> {
        Self::open_with(url, home_region, within, RequestTimeouts::default()).await
    }

    /// [`Self::open`], with how long a request waits for the database.
    pub async fn open_with(
        url: &str,
        home_region: &str,
        within: std::time::Duration,
        timeouts: RequestTimeouts,
    ) -> Result<Self, RegistryError> {
        {
            let _one_opener = open_lock(url, within).await?;
            let connection = Pool::connect_one(url).await?;
            let checked = check_initialized(&connection, home_region).await;
            connection.close().await;
            checked?;
        }
        // Eight connections on PostgreSQL (SQLite has one: [`PoolSettings`]).
        let pool = Pool::open(url, PoolSettings::new(8, timeouts)).await?;
        Ok(RegistryStore { pool, deadline: timeouts.call_deadline() })
    }

    /// `call`, or [`RegistryError::Silent`] once past the store's deadline (503 to a caller).
    async fn within<T>(&self, call: impl Future<Output = Result<T, RegistryError>>) -> Result<T, RegistryError> {
        tokio::time::timeout(self.deadline, call).await.unwrap_or(Err(RegistryError::Silent(self.deadline)))
    }

    /// The database answers, and is a registry's (`/healthz`).
    pub async fn ping(&self) -> Result<(), RegistryError> {
        self.within(async { on_driver!(&self.pool, schedule::ping()) }).await
    }

    /// Every region as of `now_ms` (a retirement whose time has come shows as done).
    pub async fn regions(&self, now_ms: i64) -> Result<Vec<Region>, RegistryError> {
        self.within(async { on_driver!(&self.pool, regions::regions(now_ms)) }).await
    }

    /// Hands out the lowest number never used. Retried when a concurrent add took the same
    /// number first (the primary key refuses the second).
    /// Its lease tables are the defaults ([`idgen::lease::default_table`]).
    pub async fn add_region(
        &self,
        name: &str,
        capacity: u32,
        actor: &str,
        now_ms: i64,
    ) -> Result<Region, RegistryError> {
        self.add_region_with_tables(name, capacity, &BTreeMap::new(), actor, now_ms).await
    }

    /// [`Self::add_region`], its lease tables `tables` where given (by layout), the defaults for
    /// every other scheduled layout.
    pub async fn add_region_with_tables(
        &self,
        name: &str,
        capacity: u32,
        tables: &BTreeMap<String, String>,
        actor: &str,
        now_ms: i64,
    ) -> Result<Region, RegistryError> {
        self.add_region_quietly(name, capacity, tables, 0, actor, now_ms).await
    }

    /// [`Self::add_region_with_tables`], refused ([`RegistryError::NewRegistryQuiet`]) within
    /// `quiet_ms` of the database's `init`. A number reported in use ([`Self::numbers_in_use`]) is
    /// never handed out before its time.
    pub async fn add_region_quietly(
        &self,
        name: &str,
        capacity: u32,
        tables: &BTreeMap<String, String>,
        quiet_ms: i64,
        actor: &str,
        now_ms: i64,
    ) -> Result<Region, RegistryError> {
        self.within(async {
            on_driver!(&self.pool, regions::add_region(name, capacity, tables, quiet_ms, actor, now_ms))
        })
        .await
    }

    /// A generator following another registry issues under region `number` as `region` until
    /// `issues_until_ms` (its copy's horizon): withheld from `regions add` until then, capped at
    /// `now_ms + lead_ms`. Reports naming this registry, or this registry's own number for the
    /// region, withhold nothing.
    #[allow(clippy::too_many_arguments)]
    pub async fn report_number_in_use(
        &self,
        number: u32,
        region: &str,
        registry_id: &str,
        issues_until_ms: i64,
        reporter: &str,
        now_ms: i64,
        lead_ms: i64,
    ) -> Result<Reported, RegistryError> {
        self.within(async {
            on_driver!(
                &self.pool,
                regions::report_number_in_use(number, region, registry_id, issues_until_ms, reporter, now_ms, lead_ms)
            )
        })
        .await
    }

    /// The numbers withheld at `now_ms` (reported in use, their time ahead).
    pub async fn numbers_in_use(&self, now_ms: i64) -> Result<Vec<NumberInUse>, RegistryError> {
        self.within(async { on_driver!(&self.pool, regions::numbers_in_use(now_ms)) }).await
    }

    /// Retires the active region of that name: at once (`at_ms` `None`, for a region that is
    /// already dead), or from `at_ms` on (the API holds it to the retire grace), until when the
    /// region stays active and the retirement can be cancelled. Its number is never handed out
    /// again either way. Refused for the home region while a layout without region bits, under
    /// which only the home region issues, is in force or scheduled; and for a region whose
    /// retirement is already pending, unless at once.
    pub async fn retire_region(
        &self,
        name: &str,
        at_ms: Option<i64>,
        actor: &str,
        now_ms: i64,
        lead_ms: i64,
    ) -> Result<Region, RegistryError> {
        self.within(async { on_driver!(&self.pool, regions::retire_region(name, at_ms, actor, now_ms, lead_ms)) }).await
    }

    /// Cancels the pending retirement of the region of that name, while its time is ahead.
    pub async fn cancel_retire(&self, name: &str, actor: &str, now_ms: i64) -> Result<Region, RegistryError> {
        self.within(async { on_driver!(&self.pool, regions::cancel_retire(name, actor, now_ms)) }).await
    }

    /// Moves region `name`'s lease table for `layout` from `from` (which must be the one named
    /// now: a compare-and-set, so two operators cannot both move it) to `to`, recording `from`
    /// as what it replaced: its generators then claim in `to` only once it was adopted from `from`
    /// (`idgen leases adopt`), which they check on the table's genesis. `to_table_id` is the
    /// adopted table's genesis (`None`: recorded by its next `idgen leases init`).
    #[allow(clippy::too_many_arguments)]
    pub async fn move_lease_table(
        &self,
        name: &str,
        layout: &str,
        from: &str,
        to: &str,
        to_table_id: Option<&str>,
        actor: &str,
        now_ms: i64,
    ) -> Result<Region, RegistryError> {
        self.within(async {
            on_driver!(&self.pool, regions::move_lease_table(name, layout, from, to, to_table_id, actor, now_ms))
        })
        .await
    }

    /// Records which table region `name`'s lease table for `layout` is (`table_id`, from its
    /// genesis), the first time it is initialized: `table` must be the table the region names, and
    /// an identity recorded before must be this one ([`RegistryError::LeaseTableIdentity`]
    /// otherwise: a second table of the same name). `true` when it was recorded now.
    pub async fn record_lease_table(
        &self,
        name: &str,
        layout: &str,
        table: &str,
        table_id: &str,
        actor: &str,
        now_ms: i64,
    ) -> Result<(Region, bool), RegistryError> {
        self.within(async {
            on_driver!(&self.pool, regions::record_lease_table(name, layout, table, table_id, actor, now_ms))
        })
        .await
    }

    /// The schedule, as published. A read, which writes nothing while the stored horizon is at
    /// least half a lead ahead (`now + lead / 2`): the horizon writer ([`Self::advance_horizon`],
    /// a task of every registry process) keeps it a whole lead ahead. Only when it has fallen
    /// that far behind (a new registry, a writer that has not run for half a lead) does a read
    /// advance it, in a transaction of its own, as the writer would.
    ///
    /// Without that transaction the horizon is read first, and the layouts after it: a layout
    /// added in between starts at or after the horizon read (it was checked against the stored
    /// horizon, which only grows), so the answer never holds a horizon past a cutover it lacks.
    /// (Read in the other order, a layout and a horizon past it could both commit in between.)
    pub async fn schedule(&self, now_unix_ms: i64, lead_ms: i64) -> Result<ScheduleView, RegistryError> {
        self.within(async { on_driver!(&self.pool, schedule::schedule(now_unix_ms, lead_ms)) }).await
    }

    /// The horizon writer: moves the stored horizon to `now + lead` (never back) and returns it.
    /// Every registry process runs it once a minute (and at start-up), so reads need not write.
    pub async fn advance_horizon(&self, now_unix_ms: i64, lead_ms: i64) -> Result<u64, RegistryError> {
        self.within(async { on_driver!(&self.pool, schedule::advance_horizon(now_unix_ms, lead_ms)) }).await
    }

    /// Schedules a new layout. It must start at or after the published horizon, strictly after
    /// the last layout, inside the 41-bit range, and carry every active region's number.
    pub async fn add_layout(
        &self,
        entry: ScheduledLayout,
        actor: &str,
        now_unix_ms: i64,
        lead_ms: i64,
    ) -> Result<ScheduledLayout, RegistryError> {
        self.within(async { on_driver!(&self.pool, schedule::add_layout(entry, actor, now_unix_ms, lead_ms)) }).await
    }

    /// The newest audit records first.
    pub async fn audit_log(&self, limit: i64) -> Result<Vec<AuditRow>, RegistryError> {
        self.within(async { on_driver!(&self.pool, audit::audit_log(limit)) }).await
    }
}

/// What `idgen registry init` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Initialized {
    /// A new registry: the home region and the first layouts are published.
    Now,
    /// Already a registry's database (migrations still pending, if any, applied): nothing else
    /// changed.
    Already { home_region: String, regions: u64 },
}

/// The registry's tables and migrations.
const SCHEMA: Schema = Schema {
    service: "registry",
    // What the running registry does: adds and retires regions, adds layouts, moves the horizon,
    // appends to the audit. It never deletes, and never changes a layout once added.
    tables: &[
        ("regions", "SELECT, INSERT, UPDATE"),
        ("layouts", "SELECT, INSERT"),
        ("schedule_state", "SELECT, UPDATE"),
        ("region_lease_tables", "SELECT, INSERT, UPDATE"),
        ("numbers_in_use", "SELECT, INSERT, UPDATE"),
        ("registry_audit", "SELECT, INSERT"),
    ],
    sequences: &["registry_audit_seq_seq"],
    sqlite: &SQLITE,
    postgres: &POSTGRES,
};

async fn open_lock(
    url: &str,
    within: std::time::Duration,
) -> Result<Option<idgen::lease::open_lock::OpenLock>, RegistryError> {
    idgen::lease::open_lock::lock_for_open_url(url, within)
        .await
        .map_err(|error| RegistryError::Storage(sqlx::Error::Configuration(Box::new(error))))
}

/// What [`RegistryStore::open`] needs: a registry's tables and no others, every migration
/// applied, the schedule published, with this home region.
/// Why a database that published `stored` as the home region is not the registry of a
/// configuration naming `configured` (`init` and `open` alike refuse it).
fn another_home_region(stored: &str, configured: &str) -> String {
    format!(
        "this registry's database has home region {stored}, and the configuration says {configured}: the home \
         region never changes once published (is database_url the right database?)"
    )
}

async fn check_initialized(connection: &Pool, home_region: &str) -> Result<(), RegistryError> {
    const INIT: &str = "idgen registry init --config <this file>";
    let refuse = |what: String| Err(RegistryError::NotARegistry(format!("refusing to start: {what}")));
    if let Some(why) = connection.refusal(&SCHEMA, INIT).await? {
        return refuse(why);
    }
    let sql = "SELECT home_region FROM schedule_state WHERE id = 1";
    let home: Option<String> = on_pool!(connection, |pool| sqlx::query_scalar(sql).fetch_optional(pool).await?);
    match home {
        None => refuse(format!("the registry's tables exist but no schedule was ever published: run `{INIT}`")),
        Some(home) if home != home_region => refuse(another_home_region(&home, home_region)),
        Some(_) => Ok(()),
    }
}

/// `now + lead` as ms since the idgen epoch, capped at the open horizon.
pub fn horizon_for(now_unix_ms: i64, lead_ms: i64) -> u64 {
    let since_epoch = now_unix_ms.saturating_add(lead_ms).saturating_sub(idgen_core::EPOCH_UNIX_MS).max(0) as u64;
    since_epoch.min(OPEN_HORIZON_MS)
}

/// One table per layout within a region: two keepers of a generator on one table would each take
/// the other's row for their own.
fn distinct_tables(name: &str, tables: &BTreeMap<String, LeaseTable>) -> Result<(), RegistryError> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (layout, table) in tables {
        if let Some(other) = seen.insert(&table.table, layout) {
            return Err(RegistryError::LeaseTableInUse {
                name: name.to_owned(),
                table: table.table.clone(),
                other: other.to_owned(),
            });
        }
    }
    Ok(())
}
