//! The registry's storage: PostgreSQL in production, SQLite as the embedded default, one
//! implementation over sqlx's `Any` driver with SQL both databases accept, and the same store
//! test suite run on both (`tests/store.rs`).

use std::collections::BTreeMap;

use idgen_core::{Layout, MAX_TIMESTAMP};
use idgen_server::database::{Connection, RequestTimeouts, Schema};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use thiserror::Error;

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/registry/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/registry/postgres");

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
    #[error("region {name} already uses {table} for layout {other}: every layout has a table of its own")]
    LeaseTableInUse { name: String, table: String, other: String },
    #[error("a layout named {0:?} is already scheduled")]
    LayoutExists(String),
    #[error("{what}")]
    ScheduleConflict { what: String },
    /// The database is not a registry's to serve from (empty, half-made, another service's, or
    /// naming another home region); the message says what was found and what to run.
    #[error("{0}")]
    NotARegistry(String),
    #[error("storage: {0}")]
    Storage(#[from] sqlx::Error),
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
    pool: AnyPool,
}

/// What [`region_row`] reads.
const REGION_COLUMNS: &str = "name, number, status, created_at_ms, retired_at_ms, retires_at_ms";

/// A region row as of `now_ms`. A retirement whose time has come reads as done (retired at that
/// time) whatever `status` still says: reads never write, and the next write makes it permanent
/// ([`settle_retirements`]).
fn region_row(row: &AnyRow, now_ms: i64) -> Result<Region, RegistryError> {
    let status: String = row.try_get("status")?;
    let number: i64 = row.try_get("number")?;
    let mut region = Region {
        name: row.try_get("name")?,
        number: u32::try_from(number).map_err(|_| RegistryError::Invalid(format!("region number {number}")))?,
        status: match status.as_str() {
            "active" => RegionStatus::Active,
            "retired" => RegionStatus::Retired,
            other => return Err(RegistryError::Invalid(format!("region status {other:?}"))),
        },
        created_at_ms: row.try_get("created_at_ms")?,
        retired_at_ms: row.try_get("retired_at_ms")?,
        retires_at_ms: None,
        lease_tables: BTreeMap::new(),
    };
    match (region.status, row.try_get::<Option<i64>, _>("retires_at_ms")?) {
        (RegionStatus::Active, Some(at)) if at <= now_ms => {
            (region.status, region.retired_at_ms) = (RegionStatus::Retired, Some(at));
        }
        (RegionStatus::Active, pending) => region.retires_at_ms = pending,
        (RegionStatus::Retired, _) => {}
    }
    Ok(region)
}

fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

impl RegistryStore {
    /// The database pool's open connections and how many of them are idle (for `/metrics`).
    pub fn pool_connections(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
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
        sqlx::any::install_default_drivers();
        // Held until the file is set up and seeded.
        let _one_opener = open_lock(url, within).await?;
        let connection = Connection::connect(url).await?;
        let migrated = connection.migrate(&SCHEMA).await;
        connection.close().await;
        migrated.map_err(|error| RegistryError::NotARegistry(format!("{error:#}")))?;
        let store = RegistryStore { pool: AnyPoolOptions::new().max_connections(1).connect(url).await? };
        let seeded = store.seed(initial).await;
        store.pool.close().await;
        seeded
    }

    /// `idgen registry init --owner-url`: gives the role the registry runs as exactly the
    /// privileges it uses (`SCHEMA`), connected as the role that owns the schema.
    pub async fn grant_runtime(owner_url: &str, role: &str, password: Option<&str>) -> Result<(), RegistryError> {
        let connection = Connection::connect(owner_url).await?;
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
        sqlx::any::install_default_drivers();
        {
            let _one_opener = open_lock(url, within).await?;
            let connection = Connection::connect(url).await?;
            let checked = check_initialized(&connection, home_region).await;
            connection.close().await;
            checked?;
        }
        // SQLite: one connection. It serializes writers anyway, and this keeps read-then-write
        // transactions from failing with SQLITE_BUSY under concurrent requests.
        let connections = if url.starts_with("sqlite:") { 1 } else { 8 };
        let statement_ms = timeouts.statement.as_millis();
        let pool = AnyPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(timeouts.acquire)
            .after_connect(move |connection, _| {
                Box::pin(async move {
                    if connection.backend_name() == "PostgreSQL" {
                        sqlx::query(&format!("SET statement_timeout = {statement_ms}"))
                            .execute(&mut *connection)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await?;
        Ok(RegistryStore { pool })
    }

    /// The database answers, and is a registry's (`/healthz`).
    pub async fn ping(&self) -> Result<(), RegistryError> {
        let row = sqlx::query("SELECT horizon_ms FROM schedule_state WHERE id = 1").fetch_optional(&self.pool).await?;
        match row {
            Some(_) => Ok(()),
            None => Err(RegistryError::Invalid("the registry's schedule state is missing".into())),
        }
    }

    async fn seed(&self, initial: &InitialSchedule) -> Result<Initialized, RegistryError> {
        let mut tx = self.pool.begin().await?;
        let seeded: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM schedule_state").fetch_one(&mut *tx).await?.try_get("n")?;
        if seeded == 0 {
            // The registry's identity: made here, once, and never again for this database.
            sqlx::query("INSERT INTO schedule_state (id, horizon_ms, home_region, registry_id) VALUES (1, 0, $1, $2)")
                .bind(&initial.home_region)
                .bind(format!("{:032x}", rand::random::<u128>()))
                .execute(&mut *tx)
                .await?;
            for entry in &initial.layouts {
                insert_layout(&mut tx, entry, 0).await?;
            }
            return match tx.commit().await {
                Ok(()) => Ok(Initialized::Now),
                // Another `init` seeded it first: what it published is checked like any other.
                Err(error) if is_unique_violation(&error) => Box::pin(self.seed(initial)).await,
                Err(error) => Err(error.into()),
            };
        }
        // Published once, the home region and the first layouts never change.
        let home: String = sqlx::query("SELECT home_region FROM schedule_state WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get("home_region")?;
        if home != initial.home_region {
            return Err(RegistryError::NotARegistry(another_home_region(&home, &initial.home_region)));
        }
        let regions: i64 = sqlx::query("SELECT COUNT(*) AS n FROM regions").fetch_one(&mut *tx).await?.try_get("n")?;
        Ok(Initialized::Already { home_region: home, regions: regions as u64 })
    }

    /// Every region as of `now_ms` (a retirement whose time has come shows as done).
    pub async fn regions(&self, now_ms: i64) -> Result<Vec<Region>, RegistryError> {
        let rows =
            sqlx::query(&format!("SELECT {REGION_COLUMNS} FROM regions ORDER BY number")).fetch_all(&self.pool).await?;
        let mut regions: Vec<Region> = rows.iter().map(|row| region_row(row, now_ms)).collect::<Result<_, _>>()?;
        let mut tables = read_lease_tables(&self.pool, None).await?;
        for region in &mut regions {
            region.lease_tables = tables.remove(&region.number).unwrap_or_default();
        }
        Ok(regions)
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
        for _ in 0..50 {
            let mut tx = self.pool.begin().await?;
            let layouts = read_layouts(&mut *tx).await?;
            if let Some(unknown) = tables.keys().find(|name| !layouts.iter().any(|l| l.layout.name() == *name)) {
                return Err(RegistryError::UnknownLayout(unknown.clone()));
            }
            let lease_tables: BTreeMap<String, LeaseTable> = layouts
                .iter()
                .map(|l| {
                    let layout = l.layout.name().to_owned();
                    let table = tables.get(&layout).cloned().unwrap_or_else(|| idgen::lease::default_table(&layout));
                    (layout, LeaseTable { table, moved_from: None })
                })
                .collect();
            distinct_tables(name, &lease_tables)?;
            // A name whose retirement time has come is free again.
            settle_retirements(&mut tx, now_ms).await?;
            let active: i64 = sqlx::query("SELECT COUNT(*) AS n FROM regions WHERE name = $1 AND status = 'active'")
                .bind(name)
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
            if active > 0 {
                return Err(RegistryError::NameExists(name.to_owned()));
            }
            let used: Vec<i64> = sqlx::query("SELECT number FROM regions ORDER BY number")
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|row| row.try_get("number"))
                .collect::<Result<_, _>>()?;
            let Some(number) = (0..i64::from(capacity)).find(|n| !used.contains(n)) else {
                return Err(RegistryError::NoNumberLeft { capacity });
            };
            let inserted =
                sqlx::query("INSERT INTO regions (number, name, status, created_at_ms) VALUES ($1, $2, 'active', $3)")
                    .bind(number)
                    .bind(name)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await;
            match inserted {
                Ok(_) => {}
                Err(error) if is_unique_violation(&error) => continue,
                Err(error) => return Err(error.into()),
            }
            for (layout, table) in &lease_tables {
                insert_lease_table(&mut tx, number, layout, table, now_ms).await?;
            }
            let named: Vec<String> = lease_tables.iter().map(|(l, t)| format!("{l} {}", t.table)).collect();
            audit(&mut tx, now_ms, actor, "add_region", &format!("{name} = {number}; {}", named.join(", "))).await?;
            match tx.commit().await {
                Ok(()) => {
                    return Ok(Region {
                        name: name.to_owned(),
                        number: number as u32,
                        status: RegionStatus::Active,
                        created_at_ms: now_ms,
                        retired_at_ms: None,
                        retires_at_ms: None,
                        lease_tables,
                    });
                }
                Err(error) if is_unique_violation(&error) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(RegistryError::ScheduleConflict { what: "too much contention adding a region; try again".into() })
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
        let mut tx = self.pool.begin().await?;
        // The state row first, as `add_layout` takes it: a layout scheduled at the same time is
        // seen here, or sees this retirement.
        let schedule = read_schedule(&mut tx, now_ms, lead_ms).await?;
        settle_retirements(&mut tx, now_ms).await?;
        let region = lock_active_region(&mut tx, name, now_ms).await?;
        if let (Some(pending), Some(_)) = (region.retires_at_ms, at_ms) {
            return Err(RegistryError::RetirePending { name: name.to_owned(), at_ms: pending });
        }
        if name == schedule.home_region
            && let Some((entry, end)) = schedule.home_only_layout(now_ms)
        {
            let text = |ms: u64| idgen_core::format_unix_ms(ms as i64 + idgen_core::EPOCH_UNIX_MS);
            let when = match (entry.from_ms <= since_epoch(now_ms), end) {
                (true, Some(end)) => format!("is in force until {}", text(end)),
                (true, None) => "is in force, with no end".to_owned(),
                (false, Some(end)) => format!("is scheduled from {} until {}", text(entry.from_ms), text(end)),
                (false, None) => format!("is scheduled from {}, with no end", text(entry.from_ms)),
            };
            return Err(RegistryError::HomeRegionInUse(format!(
                "{name} is the home region, the only region that issues under layout {layout} (no region bits), \
                 which {when}: retiring it would stop every ID meanwhile. Retire it once {layout} is over",
                layout = entry.layout.name()
            )));
        }
        let number = i64::from(region.number);
        let region = match at_ms {
            None => {
                sqlx::query(
                    "UPDATE regions SET status = 'retired', retired_at_ms = $1, retires_at_ms = $1 WHERE number = $2",
                )
                .bind(now_ms)
                .bind(number)
                .execute(&mut *tx)
                .await?;
                audit(&mut tx, now_ms, actor, "retire_region", &format!("{name} = {number}")).await?;
                Region { status: RegionStatus::Retired, retired_at_ms: Some(now_ms), retires_at_ms: None, ..region }
            }
            Some(at) => {
                sqlx::query("UPDATE regions SET retires_at_ms = $1 WHERE number = $2")
                    .bind(at)
                    .bind(number)
                    .execute(&mut *tx)
                    .await?;
                let detail = format!("{name} = {number} at {}", idgen_core::format_unix_ms(at));
                audit(&mut tx, now_ms, actor, "schedule_retire", &detail).await?;
                Region { retires_at_ms: Some(at), ..region }
            }
        };
        tx.commit().await?;
        Ok(region)
    }

    /// Cancels the pending retirement of the region of that name, while its time is ahead.
    pub async fn cancel_retire(&self, name: &str, actor: &str, now_ms: i64) -> Result<Region, RegistryError> {
        let mut tx = self.pool.begin().await?;
        settle_retirements(&mut tx, now_ms).await?;
        let region = match lock_active_region(&mut tx, name, now_ms).await {
            Err(RegistryError::UnknownRegion(_)) => {
                let retired = sqlx::query(
                    "SELECT retired_at_ms FROM regions WHERE name = $1 AND status = 'retired' \
                     ORDER BY number DESC LIMIT 1",
                )
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
                return Err(match retired {
                    Some(row) => RegistryError::AlreadyRetired {
                        name: name.to_owned(),
                        at_ms: row.try_get::<Option<i64>, _>("retired_at_ms")?.unwrap_or_default(),
                    },
                    None => RegistryError::UnknownRegion(name.to_owned()),
                });
            }
            other => other?,
        };
        let Some(at) = region.retires_at_ms else {
            return Err(RegistryError::NoRetirementPending(name.to_owned()));
        };
        sqlx::query("UPDATE regions SET retires_at_ms = NULL WHERE number = $1")
            .bind(i64::from(region.number))
            .execute(&mut *tx)
            .await?;
        let detail = format!("{name} = {}, was to retire at {}", region.number, idgen_core::format_unix_ms(at));
        audit(&mut tx, now_ms, actor, "cancel_retire", &detail).await?;
        tx.commit().await?;
        Ok(Region { retires_at_ms: None, ..region })
    }

    /// Moves region `name`'s lease table for `layout` from `from` (which must be the one named
    /// now: a compare-and-set, so two operators cannot both move it) to `to`, recording `from`
    /// as what it replaced: its generators then claim in `to` only once it was adopted from `from`
    /// (`idgen leases adopt`), which they check on the table's genesis.
    pub async fn move_lease_table(
        &self,
        name: &str,
        layout: &str,
        from: &str,
        to: &str,
        actor: &str,
        now_ms: i64,
    ) -> Result<Region, RegistryError> {
        let mut tx = self.pool.begin().await?;
        settle_retirements(&mut tx, now_ms).await?;
        let region = lock_active_region(&mut tx, name, now_ms).await?;
        let number = i64::from(region.number);
        let mut tables = read_lease_tables(&mut *tx, Some(number)).await?.remove(&region.number).unwrap_or_default();
        let current = tables.get(layout).ok_or_else(|| RegistryError::UnknownLayout(layout.to_owned()))?;
        if current.table != from {
            return Err(RegistryError::LeaseTableMoved {
                name: name.to_owned(),
                layout: layout.to_owned(),
                from: from.to_owned(),
                current: current.table.clone(),
            });
        }
        tables.insert(layout.to_owned(), LeaseTable { table: to.to_owned(), moved_from: Some(from.to_owned()) });
        distinct_tables(name, &tables)?;
        sqlx::query(
            "UPDATE region_lease_tables SET table_name = $1, moved_from = $2, set_at_ms = $3 \
             WHERE region_number = $4 AND layout = $5",
        )
        .bind(to)
        .bind(from)
        .bind(now_ms)
        .bind(number)
        .bind(layout)
        .execute(&mut *tx)
        .await?;
        audit(&mut tx, now_ms, actor, "move_lease_table", &format!("{name} {layout}: {from} -> {to}")).await?;
        tx.commit().await?;
        Ok(Region { lease_tables: tables, ..region })
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
        let state = sqlx::query("SELECT horizon_ms, home_region, registry_id FROM schedule_state WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        let horizon_ms = state.try_get::<i64, _>("horizon_ms")? as u64;
        if horizon_ms < horizon_for(now_unix_ms, lead_ms / 2) {
            let mut tx = self.pool.begin().await?;
            let view = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
            tx.commit().await?;
            return Ok(view);
        }
        let layouts = read_layouts(&self.pool).await?;
        Ok(ScheduleView {
            layouts,
            horizon_ms,
            home_region: state.try_get("home_region")?,
            registry_id: registry_id(&state)?,
        })
    }

    /// The horizon writer: moves the stored horizon to `now + lead` (never back) and returns it.
    /// Every registry process runs it once a minute (and at start-up), so reads need not write.
    pub async fn advance_horizon(&self, now_unix_ms: i64, lead_ms: i64) -> Result<u64, RegistryError> {
        let mut tx = self.pool.begin().await?;
        let view = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
        tx.commit().await?;
        Ok(view.horizon_ms)
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
        // Validation and insert happen in one transaction that first updates (and so locks) the
        // state row: a concurrent reader, which advances the horizon through the same row, waits
        // and then sees the new layout. No generator can be handed a horizon past a cutover it
        // was not told about.
        let mut tx = self.pool.begin().await?;
        let current = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
        settle_retirements(&mut tx, now_unix_ms).await?;
        let conflict = |what: String| Err(RegistryError::ScheduleConflict { what });
        if current.layouts.iter().any(|l| l.layout.name() == entry.layout.name()) {
            return Err(RegistryError::LayoutExists(entry.layout.name().to_owned()));
        }
        if entry.from_ms > MAX_TIMESTAMP {
            return conflict(format!("from {} ms is past the last representable timestamp", entry.from_ms));
        }
        if entry.from_ms < current.horizon_ms {
            return conflict(format!(
                "from {} must be at or after the published horizon {}",
                idgen_core::format_unix_ms(entry.from_ms as i64 + idgen_core::EPOCH_UNIX_MS),
                idgen_core::format_unix_ms(current.horizon_ms.min(MAX_TIMESTAMP) as i64 + idgen_core::EPOCH_UNIX_MS)
            ));
        }
        if let Some(last) = current.layouts.last().filter(|last| entry.from_ms <= last.from_ms) {
            return conflict(format!(
                "from must be strictly after the last layout {} (from_ms {})",
                last.layout.name(),
                last.from_ms
            ));
        }
        if entry.layout.region_bits() > 0 {
            let max = i64::from(entry.layout.max_region());
            let row = sqlx::query(
                "SELECT name, number FROM regions WHERE status = 'active' AND number > $1 ORDER BY number LIMIT 1",
            )
            .bind(max)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = row {
                let (name, number): (String, i64) = (row.try_get("name")?, row.try_get("number")?);
                return conflict(format!(
                    "active region {name} has number {number}, which {} bits of region cannot carry",
                    entry.layout.region_bits()
                ));
            }
        }
        if entry.layout.region_bits() == 0 {
            // Only the home region issues under it: one retired, or retiring, would leave none.
            let home = &current.home_region;
            let rows = sqlx::query("SELECT status, retires_at_ms FROM regions WHERE name = $1")
                .bind(home)
                .fetch_all(&mut *tx)
                .await?;
            let mut active = None;
            for row in &rows {
                if row.try_get::<String, _>("status")? == "active" {
                    active = Some(row.try_get::<Option<i64>, _>("retires_at_ms")?);
                }
            }
            match active {
                Some(Some(at)) => {
                    return conflict(format!(
                        "the home region {home} retires at {}, and only the home region issues under a layout \
                         without region bits: cancel that retirement first",
                        idgen_core::format_unix_ms(at)
                    ));
                }
                None if !rows.is_empty() => {
                    return conflict(format!(
                        "the home region {home} is retired, and only the home region issues under a layout \
                         without region bits"
                    ));
                }
                _ => {}
            }
        }
        match insert_layout(&mut tx, &entry, now_unix_ms).await {
            Ok(()) => {}
            Err(RegistryError::Storage(error)) if is_unique_violation(&error) => {
                return Err(RegistryError::LayoutExists(entry.layout.name().to_owned()));
            }
            Err(error) => return Err(error),
        }
        // Every active region's generators will claim under it in its default table.
        sqlx::query(
            "INSERT INTO region_lease_tables (region_number, layout, table_name, set_at_ms) \
             SELECT number, $1, $2, $3 FROM regions WHERE status = 'active'",
        )
        .bind(entry.layout.name())
        .bind(idgen::lease::default_table(entry.layout.name()))
        .bind(now_unix_ms)
        .execute(&mut *tx)
        .await?;
        let l = &entry.layout;
        let detail = format!(
            "{} = {}+{}+{} from_ms {}",
            l.name(),
            l.region_bits(),
            l.machine_bits(),
            l.sequence_bits(),
            entry.from_ms
        );
        audit(&mut tx, now_unix_ms, actor, "add_layout", &detail).await?;
        tx.commit().await?;
        Ok(entry)
    }

    /// The newest audit records first.
    pub async fn audit_log(&self, limit: i64) -> Result<Vec<AuditRow>, RegistryError> {
        let rows = sqlx::query("SELECT at_ms, actor, action, detail FROM registry_audit ORDER BY seq DESC LIMIT $1")
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    at_ms: row.try_get("at_ms")?,
                    actor: row.try_get("actor")?,
                    action: row.try_get("action")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
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

async fn check_initialized(connection: &Connection, home_region: &str) -> Result<(), RegistryError> {
    const INIT: &str = "idgen registry init --config <this file>";
    let refuse = |what: String| Err(RegistryError::NotARegistry(format!("refusing to start: {what}")));
    if let Some(why) = connection.refusal(&SCHEMA, INIT).await? {
        return refuse(why);
    }
    let sql = "SELECT home_region FROM schedule_state WHERE id = 1";
    let home: Option<String> = match connection {
        Connection::Sqlite(pool) => sqlx::query_scalar(sql).fetch_optional(pool).await?,
        Connection::Postgres(pool) => sqlx::query_scalar(sql).fetch_optional(pool).await?,
    };
    match home {
        None => refuse(format!("the registry's tables exist but no schedule was ever published: run `{INIT}`")),
        Some(home) if home != home_region => refuse(another_home_region(&home, home_region)),
        Some(_) => Ok(()),
    }
}

/// The schedule inside a transaction: the state row is updated first (advancing the horizon to
/// at least `now + lead`, never back), which locks it until the transaction ends.
async fn read_schedule(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    now_unix_ms: i64,
    lead_ms: i64,
) -> Result<ScheduleView, RegistryError> {
    let wanted = horizon_for(now_unix_ms, lead_ms) as i64;
    sqlx::query(
        "UPDATE schedule_state SET horizon_ms = CASE WHEN horizon_ms < $1 THEN $1 ELSE horizon_ms END WHERE id = 1",
    )
    .bind(wanted)
    .execute(&mut **tx)
    .await?;
    let state = sqlx::query("SELECT horizon_ms, home_region, registry_id FROM schedule_state WHERE id = 1")
        .fetch_one(&mut **tx)
        .await?;
    let layouts = read_layouts(&mut **tx).await?;
    let horizon_ms: i64 = state.try_get("horizon_ms")?;
    Ok(ScheduleView {
        layouts,
        horizon_ms: horizon_ms as u64,
        home_region: state.try_get("home_region")?,
        registry_id: registry_id(&state)?,
    })
}

/// Every scheduled layout, in the order they start.
async fn read_layouts<'c>(
    executor: impl sqlx::Executor<'c, Database = sqlx::Any>,
) -> Result<Vec<ScheduledLayout>, RegistryError> {
    let rows =
        sqlx::query("SELECT name, region_bits, machine_bits, sequence_bits, from_ms FROM layouts ORDER BY from_ms")
            .fetch_all(executor)
            .await?;
    let mut layouts = Vec::new();
    for row in &rows {
        let bits = |name: &str| -> Result<u8, RegistryError> {
            let value: i64 = row.try_get(name)?;
            u8::try_from(value).map_err(|_| RegistryError::Invalid(format!("{name} = {value}")))
        };
        let layout = Layout::new(
            row.try_get::<String, _>("name")?,
            bits("region_bits")?,
            bits("machine_bits")?,
            bits("sequence_bits")?,
        )
        .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let from_ms: i64 = row.try_get("from_ms")?;
        layouts.push(ScheduledLayout { layout, from_ms: from_ms as u64 });
    }
    Ok(layouts)
}

/// Makes every retirement whose time has come permanent (`status = 'retired'`), so that a write's
/// checks, and the unique index on active names, see it. Every write transaction starts with it;
/// reads leave it be and compute the status from the time ([`region_row`]).
async fn settle_retirements(tx: &mut sqlx::Transaction<'_, sqlx::Any>, now_ms: i64) -> Result<(), RegistryError> {
    sqlx::query(
        "UPDATE regions SET status = 'retired', retired_at_ms = retires_at_ms \
         WHERE status = 'active' AND retires_at_ms <= $1",
    )
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The active region of that name, its row locked until the transaction ends (a no-op update:
/// SQL both databases accept), so that a concurrent retire or cancel waits and then sees this
/// one's result.
async fn lock_active_region(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    name: &str,
    now_ms: i64,
) -> Result<Region, RegistryError> {
    let row = sqlx::query(&format!(
        "UPDATE regions SET status = status WHERE name = $1 AND status = 'active' RETURNING {REGION_COLUMNS}"
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    region_row(&row.ok_or_else(|| RegistryError::UnknownRegion(name.to_owned()))?, now_ms)
}

/// `now + lead` as ms since the idgen epoch, capped at the open horizon.
pub fn horizon_for(now_unix_ms: i64, lead_ms: i64) -> u64 {
    let since_epoch = now_unix_ms.saturating_add(lead_ms).saturating_sub(idgen_core::EPOCH_UNIX_MS).max(0) as u64;
    since_epoch.min(OPEN_HORIZON_MS)
}

async fn insert_layout(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    entry: &ScheduledLayout,
    now_ms: i64,
) -> Result<(), RegistryError> {
    let l = &entry.layout;
    sqlx::query(
        "INSERT INTO layouts (name, region_bits, machine_bits, sequence_bits, from_ms, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(l.name())
    .bind(i64::from(l.region_bits()))
    .bind(i64::from(l.machine_bits()))
    .bind(i64::from(l.sequence_bits()))
    .bind(entry.from_ms as i64)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    at_ms: i64,
    actor: &str,
    action: &str,
    detail: &str,
) -> Result<(), RegistryError> {
    sqlx::query("INSERT INTO registry_audit (at_ms, actor, action, detail) VALUES ($1, $2, $3, $4)")
        .bind(at_ms)
        .bind(actor)
        .bind(action)
        .bind(detail)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn registry_id(state: &AnyRow) -> Result<String, RegistryError> {
    state
        .try_get::<Option<String>, _>("registry_id")?
        .ok_or_else(|| RegistryError::Invalid("the registry has no identity: run `idgen registry init`".into()))
}

/// The lease tables, by region number and layout (of one region, or all).
async fn read_lease_tables<'c>(
    executor: impl sqlx::Executor<'c, Database = sqlx::Any>,
    region_number: Option<i64>,
) -> Result<BTreeMap<u32, BTreeMap<String, LeaseTable>>, RegistryError> {
    const SELECT: &str = "SELECT region_number, layout, table_name, moved_from FROM region_lease_tables";
    let rows = match region_number {
        Some(number) => {
            sqlx::query(&format!("{SELECT} WHERE region_number = $1")).bind(number).fetch_all(executor).await?
        }
        None => sqlx::query(SELECT).fetch_all(executor).await?,
    };
    let mut tables: BTreeMap<u32, BTreeMap<String, LeaseTable>> = BTreeMap::new();
    for row in &rows {
        let number: i64 = row.try_get("region_number")?;
        let number = u32::try_from(number).map_err(|_| RegistryError::Invalid(format!("region number {number}")))?;
        tables.entry(number).or_default().insert(
            row.try_get("layout")?,
            LeaseTable { table: row.try_get("table_name")?, moved_from: row.try_get("moved_from")? },
        );
    }
    Ok(tables)
}

async fn insert_lease_table(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    region_number: i64,
    layout: &str,
    table: &LeaseTable,
    now_ms: i64,
) -> Result<(), RegistryError> {
    sqlx::query(
        "INSERT INTO region_lease_tables (region_number, layout, table_name, moved_from, set_at_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(region_number)
    .bind(layout)
    .bind(&table.table)
    .bind(&table.moved_from)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
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
