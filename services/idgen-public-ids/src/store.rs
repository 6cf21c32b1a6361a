//! Mappings and wrapped data keys, in PostgreSQL (production) or SQLite (embedded default), the
//! same suite run on both.
//!
//! PostgreSQL keeps a mapping at its cost: a table per stored format (the format is the table,
//! not a text on every row), the public ID as its 16 bytes in a `uuid` (opaque IDs are 128
//! random bits, UUIDv7s are UUIDs), the internal ID as a `bigint`, and nothing else: no read
//! needs the creation time the first schema kept, so it went. A row is 24 bytes of data after
//! PostgreSQL's 24-byte tuple header; the primary key (internal ID) serves lookups, and an
//! index of the public ID's last 8 bytes resolves ([`public_id_key`]; migration 0003 says why).
//! It is reached through its own driver: prepared statements, a batch bound as two arrays, a
//! bounded pool and a statement timeout ([`PoolSettings`]), and an optional read replica that
//! never answers "not found" alone ([`PublicIdStore::with_replica`]). SQLite, the embedded
//! default, keeps the first schema (one table, the public ID as its text).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idgen_server::database::{Connection, Schema};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

use crate::format::{self, Format, RandomUnavailable};

pub mod check;
pub mod legacy;

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/public_ids/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/public_ids/postgres");

/// The service's tables and migrations.
const SCHEMA: Schema = Schema {
    service: "public-ID service",
    // What the running service does: adds mappings and reads them, reads the wrapped data keys.
    // A mapping is never changed or deleted; data keys are made and re-wrapped by `idgen public
    // init` and `rotate-key`, under the role that owns the schema. PostgreSQL keeps mappings in
    // a table per format; `public_ids` is SQLite's one table, and PostgreSQL's from before, kept
    // in step with the new ones ([`legacy`]) until `idgen public drop-legacy-table`.
    tables: &[
        ("public_ids_opaque", "SELECT, INSERT"),
        ("public_ids_uuidv7", "SELECT, INSERT"),
        ("public_ids", "SELECT, INSERT"),
        ("public_ids_legacy_copy", "SELECT"),
        ("public_id_keys", "SELECT"),
        ("public_id_check_keys", "SELECT"),
        ("public_id_legacy_filter", "SELECT"),
    ],
    sequences: &[],
    sqlite: &SQLITE,
    postgres: &POSTGRES,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub internal_id: u64,
    pub format: Format,
    /// The stored text, without a type's prefix: 26 Crockford characters (opaque) or a
    /// hyphenated UUID ([`format::stored_text`]); [`crate::types::Types::text`] makes what is
    /// handed out.
    pub public_id: String,
    /// The mapping's type number ([`crate::types`]), `None` for an untyped one. A create finding
    /// a mapping made before answers with that mapping's type, which may not be the one asked.
    pub type_number: Option<u16>,
    /// False when the mapping already existed (the create was idempotent).
    pub created: bool,
}

/// A stored mapping as PostgreSQL's statements answer it: internal ID, public ID, type number.
type Row = (i64, uuid::Uuid, Option<i16>);

/// A type number as the database keeps it (a `smallint`; numbers are 1 to 32767, [`crate::types`]).
fn type_column(type_number: Option<u16>) -> Option<i16> {
    type_number.map(|n| i16::try_from(n).expect("type numbers are validated to 1..=32767"))
}

/// A type number as the database answered it: only positive ones are ever written (and checked).
fn type_of(column: Option<i16>) -> Option<u16> {
    column.and_then(|n| u16::try_from(n).ok())
}

/// Why a create did not finish: the database, or the random source the public IDs are drawn
/// from (then nothing drawn from it was stored).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Storage(#[from] sqlx::Error),
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
}

/// Why a resolve was not answered: the database, or the budget of primary reads for the
/// replica's misses, all taken (counted, not logged: a flood would fill the log).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Storage(#[from] sqlx::Error),
    #[error("the primary's reads for resolves the read replica missed are all taken")]
    FallbacksBusy,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageOperationLabel {
    pub operation: &'static str,
}

/// Every operation a failed database call is counted under: the API's (create, resolve,
/// lookup), the data keys' (read_keys at start-up, add_key by `rotate-key`) and the probe's.
pub const STORAGE_OPERATIONS: [&str; 6] = ["create", "resolve", "lookup", "read_keys", "add_key", "probe"];

/// The database as `/metrics` shows it: whether the last probe reached it, and failed calls.
#[derive(Default)]
pub struct StoreMetrics {
    /// 1 if the last probe (`SELECT 1`) answered within its time, 0 if not.
    pub up: Gauge,
    pub errors: Family<StorageOperationLabel, Counter>,
    /// Resolves and lookups asked of the read replica, by what came of it ([`REPLICA_OUTCOMES`]).
    pub replica_reads: Family<ReplicaOutcomeLabel, Counter>,
    /// Resolves the replica missed, by what came of them ([`FALLBACK_OUTCOMES`]).
    pub primary_fallbacks: Family<ReplicaOutcomeLabel, Counter>,
    /// The replica's lag as last measured (ms), -1 when it could not be measured.
    pub replica_lag_ms: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaOutcomeLabel {
    pub outcome: &'static str,
}

/// What a read meant for the replica: `found` there; `missed` there and asked of the primary
/// (replica lag, or an ID that exists nowhere); `failed` there (asked of the primary, and the
/// replica left alone for [`REPLICA_RETRY`]); `skipped` (asked only of the primary, within that
/// time).
pub const REPLICA_OUTCOMES: [&str; 4] = ["found", "missed", "failed", "skipped"];

/// What became of a resolve the replica missed: `read` on the primary, within the budget;
/// `refused` (503 with `Retry-After`: the budget's reads were all taken); `final` (a UUIDv7 older
/// than the replica's lag bound, with the replica's measured lag within it: the miss is the answer).
pub const FALLBACK_OUTCOMES: [&str; 3] = ["read", "refused", "final"];

/// How long reads leave a replica alone after it failed one, so that a replica that is gone costs
/// one timeout, not one per request.
pub const REPLICA_RETRY: Duration = Duration::from_secs(5);

impl StoreMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for operation in STORAGE_OPERATIONS {
            let _ = self.errors.get_or_create(&StorageOperationLabel { operation });
        }
        registry.register(
            "idgen_public_database_up",
            "1 if the last probe of the public-ID database (SELECT 1) answered in time, else 0",
            self.up.clone(),
        );
        registry.register(
            "idgen_public_storage_errors",
            "Failed calls to the public-ID database, by operation (create, resolve, lookup, read_keys, add_key, probe)",
            self.errors.clone(),
        );
    }

    /// The replica's series, each at 0 from the start: only with a `read_database_url`.
    pub fn register_replica(&self, registry: &mut Registry) {
        for outcome in REPLICA_OUTCOMES {
            let _ = self.replica_reads.get_or_create(&ReplicaOutcomeLabel { outcome });
        }
        registry.register(
            "idgen_public_replica_reads",
            "Resolves and lookups asked of the read replica, by outcome: found there; missed there and asked of the \
             primary; failed there and asked of the primary; skipped (the replica failed within the last 5 s)",
            self.replica_reads.clone(),
        );
        for outcome in FALLBACK_OUTCOMES {
            let _ = self.primary_fallbacks.get_or_create(&ReplicaOutcomeLabel { outcome });
        }
        registry.register(
            "idgen_public_primary_fallbacks",
            "Resolves the read replica missed, by outcome: read on the primary (within primary_fallback_reads at \
             once); refused 503 (that many were already reading); final (a UUIDv7 older than replica_lag_bound_ms, \
             the replica's lag within it: not found)",
            self.primary_fallbacks.clone(),
        );
        self.replica_lag_ms.set(-1);
        registry.register(
            "idgen_public_replica_lag_ms",
            "How far the read replica was behind its primary at the last probe (ms); -1 when it could not be \
             measured (then no miss there is final)",
            self.replica_lag_ms.clone(),
        );
    }
}

/// What a replica's resolve misses may cost the primary ([`PublicIdStore::with_replica`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackSettings {
    /// Resolves the replica missed that may read the primary at once; more are refused 503.
    pub reads: u32,
    /// A UUIDv7 public ID older than this, missed by a replica measured to lag less, is not found
    /// without asking the primary.
    pub lag_bound: Duration,
}

impl Default for FallbackSettings {
    fn default() -> Self {
        FallbackSettings { reads: 4, lag_bound: Duration::from_secs(60) }
    }
}

/// How the service's PostgreSQL pool behaves under load ([`crate::config::PublicIdsConfig`]'s
/// `database_*` keys): a request waits at most `acquire_timeout` for a connection and a
/// statement runs at most `statement_timeout` (PostgreSQL's own `statement_timeout`, set on every
/// connection), so an exhausted pool or a slow database answers 503 quickly, never hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub connections: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        let timeouts = idgen_server::database::RequestTimeouts::default();
        PoolSettings { connections: 16, acquire_timeout: timeouts.acquire, statement_timeout: timeouts.statement }
    }
}

/// The one database: PostgreSQL through its own driver (prepared statements, a public ID bound
/// as a `uuid`), or SQLite's one file.
#[derive(Clone)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// PostgreSQL's statements on the mappings of one stored format, each prepared once per
/// connection (sqlx keeps them by their text). A batch is bound as two arrays, so a batch of any
/// size is one statement.
struct Statements {
    resolve: &'static str,
    lookup: &'static str,
    /// Inserts what is offered, except a row whose internal ID is mapped already (the primary
    /// key) or whose public ID another row holds (looked up through the index of its last 8
    /// bytes, which is not unique: migration 0003 says why), and answers the rows it inserted.
    /// Two creates drawing the same 128 random bits at the same moment could both pass the
    /// look; a resolve would then find two rows and answer 503, never a wrong internal ID.
    insert: &'static str,
    /// The mappings of the internal IDs the insert did not map: asked only when there are any
    /// (an idempotent create, or a collision), so a create of new IDs is one statement. Also
    /// what [`legacy`] compares the old table's rows with.
    existing: &'static str,
    /// [`legacy::copy`]'s insert of rows from the old table: as they are, the internal ID's
    /// conflict only skipping a row copied before (by the trigger, or an earlier run).
    copy: &'static str,
}

macro_rules! statements {
    ($table:literal) => {
        Statements {
            // The index is of the public ID's last 8 bytes ($1); all 16 are compared.
            // Two rows would be a public ID held twice, which creates never make: LIMIT 2 finds it.
            resolve: concat!(
                "SELECT internal_id, id_type FROM ",
                $table,
                " WHERE public_id_key(public_id) = $1 AND public_id = $2 LIMIT 2"
            ),
            lookup: concat!("SELECT public_id, id_type FROM ", $table, " WHERE internal_id = $1"),
            // $3 is the type number of every row offered (NULL: untyped).
            insert: concat!(
                "INSERT INTO ",
                $table,
                " (internal_id, public_id, id_type) SELECT o.internal_id, o.public_id, $3::SMALLINT \
                 FROM UNNEST($1::BIGINT[], $2::UUID[]) AS o (internal_id, public_id) \
                 WHERE NOT EXISTS (SELECT 1 FROM ",
                $table,
                " x WHERE public_id_key(x.public_id) = public_id_key(o.public_id) AND x.public_id = o.public_id) \
                 ON CONFLICT DO NOTHING RETURNING internal_id, public_id"
            ),
            existing: concat!(
                "SELECT internal_id, public_id, id_type FROM ",
                $table,
                " WHERE internal_id = ANY($1::BIGINT[])"
            ),
            copy: concat!(
                "INSERT INTO ",
                $table,
                " (internal_id, public_id) SELECT * FROM UNNEST($1::BIGINT[], $2::UUID[]) ON CONFLICT DO NOTHING"
            ),
        }
    };
}

const OPAQUE: Statements = statements!("public_ids_opaque");
const UUIDV7: Statements = statements!("public_ids_uuidv7");

fn statements(format: Format) -> &'static Statements {
    match format {
        Format::Uuidv7 => &UUIDV7,
        _ => &OPAQUE,
    }
}

/// A PostgreSQL URL's options with the statement timeout of `settings` on every connection.
fn pg_options(url: &str, settings: PoolSettings) -> Result<PgConnectOptions, sqlx::Error> {
    let statement_timeout = settings.statement_timeout.as_millis().to_string();
    Ok(PgConnectOptions::from_str(url)?.options([("statement_timeout", statement_timeout)]))
}

/// A stored public ID's text as the `uuid` PostgreSQL keeps; `None` for text of another shape.
fn as_uuid(format: Format, text: &str) -> Option<uuid::Uuid> {
    format::stored_bytes(format, text).map(uuid::Uuid::from_bytes)
}

#[derive(Clone)]
pub struct PublicIdStore {
    pool: Pool,
    /// The read replica resolves and lookups ask first, if one is configured.
    replica: Option<Replica>,
    metrics: Arc<StoreMetrics>,
    /// The longest a call may take, whatever the database does ([`Self::within`]).
    deadline: Duration,
}

/// A read replica (a streaming replica, an Aurora reader): asked first by resolves and lookups,
/// never trusted with "not found" (a miss there is asked of the primary: replica lag never
/// answers 404 for a mapping that exists), and left alone for [`REPLICA_RETRY`] after it fails.
#[derive(Clone)]
struct Replica {
    pool: PgPool,
    /// Until when (ms on the process's monotonic clock) reads skip it.
    skip_until_ms: Arc<AtomicU64>,
    began: Instant,
    /// The primary reads of resolves it missed, at most [`FallbackSettings::reads`] at once.
    fallbacks: Arc<tokio::sync::Semaphore>,
    lag_bound_ms: u64,
    /// Its lag at the last probe (ms) and when that was (ms on the monotonic clock above);
    /// `u64::MAX` before the first answer or after one that failed.
    lag: Arc<(AtomicU64, AtomicU64)>,
}

impl Replica {
    fn now_ms(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// Whether a replica's miss of the UUIDv7 `public_id` is the answer: it was made longer than
    /// the lag bound ago, and the replica's lag now (the last measure plus the time since, as it
    /// can grow no faster) is within the bound.
    fn miss_is_final(&self, public_id: &[u8; 16]) -> bool {
        let mut made = [0u8; 8];
        made[2..].copy_from_slice(&public_id[..6]);
        let age_ms = (idgen::system_unix_ms().max(0) as u64).saturating_sub(u64::from_be_bytes(made));
        let (lag, at) = (self.lag.0.load(Ordering::Relaxed), self.lag.1.load(Ordering::Relaxed));
        let lag_now = lag.saturating_add(self.now_ms().saturating_sub(at));
        age_ms > self.lag_bound_ms && lag != u64::MAX && lag_now < self.lag_bound_ms
    }
}

/// What the replica answered a read.
enum ReplicaAnswer<T> {
    Found(T),
    Missed,
    Failed,
}

/// How far a streaming replica is behind its primary (ms): nothing received but not replayed, the
/// time since the primary's last message; otherwise the time since the last replayed commit. No
/// row when it is not streaming or cannot say (a role without `pg_read_all_stats`, a replica of
/// another kind): then no miss there is final.
const REPLICA_LAG: &str = "SELECT (EXTRACT(EPOCH FROM clock_timestamp() - CASE WHEN pg_last_wal_receive_lsn() = \
     pg_last_wal_replay_lsn() THEN r.last_msg_send_time ELSE pg_last_xact_replay_timestamp() END) * 1000)::BIGINT \
     FROM pg_stat_wal_receiver r WHERE r.status = 'streaming' AND r.last_msg_send_time IS NOT NULL";

fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

/// Runs `$body` with `$pool` bound to whichever pool the store has (the same sqlx calls on both).
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.pool {
            Pool::Postgres($pool) => $body,
            Pool::Sqlite($pool) => $body,
        }
    };
}

impl PublicIdStore {
    /// The database pool's open connections and how many of them are idle (for `/metrics`).
    pub fn pool_connections(&self) -> (u32, usize) {
        on_pool!(self, |pool| (pool.size(), pool.num_idle()))
    }

    /// What `/metrics` shows of the database: register it once.
    pub fn metrics(&self) -> &Arc<StoreMetrics> {
        &self.metrics
    }

    /// Counts a failed call under `operation`.
    fn counted<T>(&self, operation: &'static str, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        debug_assert!(STORAGE_OPERATIONS.contains(&operation), "{operation} is not in STORAGE_OPERATIONS");
        if result.is_err() {
            self.metrics.errors.get_or_create(&StorageOperationLabel { operation }).inc();
        }
        result
    }

    /// One probe of the database: `SELECT 1` through the pool (what a request would wait for),
    /// within `within`. Sets `idgen_public_database_up` and returns whether it answered; a
    /// failure is counted (`probe`) and logged.
    pub async fn probe(&self, within: Duration) -> bool {
        let asked = async { on_pool!(self, |pool| sqlx::query("SELECT 1").execute(pool).await.map(|_| ())) };
        let answer = match tokio::time::timeout(within, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        };
        if let Err(error) = &answer {
            tracing::error!(%error, "public-ID storage: the database probe failed");
        }
        let up = self.counted("probe", answer).is_ok();
        self.metrics.up.set(i64::from(up));
        up
    }

    /// Development: initializes the database if it is new ([`Self::initialize`]) and opens it.
    /// Production starts with [`Self::open`], which never initializes.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Self::connect_waiting(url, idgen::lease::open_lock::DEFAULT_OPEN_TIMEOUT).await
    }

    /// [`Self::connect`], waiting up to `within` for other processes opening the same SQLite
    /// file ([`idgen::lease::open_lock`]).
    pub async fn connect_waiting(url: &str, within: Duration) -> anyhow::Result<Self> {
        Self::initialize(url, within, None).await?;
        Self::open(url, within).await
    }

    /// The migrations (`idgen public init`): makes an empty database the service's, or applies
    /// those still pending, then copies the mappings of a PostgreSQL database made before
    /// mappings were kept at 16 bytes ([`legacy`]); refuses another service's database. With
    /// `runtime_role` (PostgreSQL), that role (made with the password, if one is given) is then
    /// granted exactly what the service uses.
    pub async fn initialize(
        url: &str,
        within: Duration,
        runtime_role: Option<(&str, Option<&str>)>,
    ) -> anyhow::Result<Option<legacy::Copied>> {
        // Held until the file is set up.
        let _one_opener = idgen::lease::open_lock::lock_for_open_url(url, within).await?;
        let connection = Connection::connect(url).await?;
        let done = async {
            let new_database = connection.found(&SCHEMA).await? == idgen_server::database::Found::Empty;
            connection.migrate(&SCHEMA).await?;
            check::initialize((&connection).into(), new_database, idgen::system_unix_ms()).await?;
            let copied = match &connection {
                Connection::Postgres(pool) => legacy::copy(pool, legacy::BATCH).await?,
                Connection::Sqlite(_) => None,
            };
            if let Some((role, password)) = runtime_role {
                connection.grant(&SCHEMA, role, password).await?;
            }
            Ok(copied)
        }
        .await;
        connection.close().await;
        done
    }

    /// [`Self::open_with`] the default pool settings (the CLI's short tasks).
    pub async fn open(url: &str, within: Duration) -> anyhow::Result<Self> {
        Self::open_with(url, within, PoolSettings::default()).await
    }

    /// Opens the service's database to serve from it. Never initializes: an empty database, one
    /// with migrations pending, one whose mappings made before are not all copied yet, or another
    /// service's is refused ([`idgen::config::Refused`], saying what to run).
    pub async fn open_with(url: &str, within: Duration, settings: PoolSettings) -> anyhow::Result<Self> {
        let init = "idgen public init --config <this file>";
        {
            let _one_opener = idgen::lease::open_lock::lock_for_open_url(url, within).await?;
            let connection = Connection::connect(url).await?;
            let mut refusal = connection.refusal(&SCHEMA, init).await;
            if let (Ok(None), Connection::Postgres(pool)) = (&refusal, &connection) {
                refusal = legacy::refusal(pool, init).await;
            }
            connection.close().await;
            if let Some(why) = refusal? {
                return Err(idgen::config::Refused(format!(
                    "public-ID database {}: refusing to start: {why}",
                    idgen::config::redacted_url(url)
                ))
                .into());
            }
        }
        let pool = if url.starts_with("postgres") {
            let options = pg_options(url, settings)?;
            Pool::Postgres(
                PgPoolOptions::new()
                    .max_connections(settings.connections)
                    .acquire_timeout(settings.acquire_timeout)
                    .connect_with(options)
                    .await?,
            )
        } else {
            let options = SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(5));
            Pool::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(settings.acquire_timeout)
                    .connect_with(options)
                    .await?,
            )
        };
        // statement_timeout is the server's: a database that is gone without a word (a partition,
        // packets dropped) would keep a call waiting on TCP for minutes. This bounds it here.
        let deadline = settings.acquire_timeout + settings.statement_timeout + Duration::from_secs(1);
        Ok(PublicIdStore { pool, replica: None, metrics: Arc::default(), deadline })
    }

    /// Whether PostgreSQL still keeps the table of mappings made before 16-byte storage, kept in
    /// step with the new ones for instances of the previous version ([`legacy`]), which know no
    /// types: the service refuses `[types]` until it is dropped.
    pub async fn legacy_table_remains(&self) -> Result<bool, sqlx::Error> {
        match &self.pool {
            Pool::Postgres(pool) => legacy::legacy_exists(pool).await,
            Pool::Sqlite(_) => Ok(false),
        }
    }

    /// Resolves and lookups ask the PostgreSQL replica at `url` first ([`Replica`]), through a
    /// pool of the same settings. Connected lazily: a replica that is down at start-up does not
    /// keep the service from starting, its reads go to the primary.
    pub fn with_replica(
        mut self,
        url: &str,
        settings: PoolSettings,
        fallback: FallbackSettings,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            matches!(self.pool, Pool::Postgres(_)),
            "read_database_url: a read replica needs a PostgreSQL database_url"
        );
        let pool = PgPoolOptions::new()
            .max_connections(settings.connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_lazy_with(pg_options(url, settings)?);
        self.replica = Some(Replica {
            pool,
            skip_until_ms: Arc::default(),
            began: Instant::now(),
            fallbacks: Arc::new(tokio::sync::Semaphore::new(fallback.reads as usize)),
            lag_bound_ms: fallback.lag_bound.as_millis() as u64,
            lag: Arc::new((AtomicU64::new(u64::MAX), AtomicU64::new(0))),
        });
        Ok(self)
    }

    /// Measures the replica's lag (`idgen_public_replica_lag_ms`), within `within`; nothing
    /// without a replica.
    pub async fn probe_replica_lag(&self, within: Duration) {
        let Some(replica) = &self.replica else { return };
        let asked = sqlx::query_scalar::<_, i64>(REPLICA_LAG).fetch_optional(&replica.pool);
        let lag = match tokio::time::timeout(within, asked).await {
            Ok(Ok(Some(lag))) => Some(lag.max(0) as u64),
            _ => None,
        };
        replica.lag.1.store(replica.now_ms(), Ordering::Relaxed);
        replica.lag.0.store(lag.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.metrics.replica_lag_ms.set(lag.map_or(-1, |lag| lag as i64));
    }

    fn fallback_outcome(&self, outcome: &'static str) {
        self.metrics.primary_fallbacks.get_or_create(&ReplicaOutcomeLabel { outcome }).inc();
    }

    /// `asked`, or a timeout error once [`Self::deadline`] (the acquire timeout, the statement
    /// timeout and a second) has passed without an answer.
    async fn within<T>(&self, asked: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, sqlx::Error> {
        match tokio::time::timeout(self.deadline, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the database did not answer within {} ms", self.deadline.as_millis()),
            ))),
        }
    }

    /// The replica, unless there is none or it failed within [`REPLICA_RETRY`] (`skipped`).
    fn replica(&self) -> Option<&Replica> {
        let replica = self.replica.as_ref()?;
        if replica.now_ms() < replica.skip_until_ms.load(Ordering::Relaxed) {
            self.replica_outcome("skipped");
            return None;
        }
        Some(replica)
    }

    fn replica_outcome(&self, outcome: &'static str) {
        self.metrics.replica_reads.get_or_create(&ReplicaOutcomeLabel { outcome }).inc();
    }

    /// What the replica answered, if it is to be the answer: found there. A miss or a failure
    /// is `None` (the caller asks the primary); a failure also leaves the replica alone for a
    /// while.
    fn answer_of_replica<T>(&self, replica: &Replica, answer: Result<Option<T>, sqlx::Error>) -> ReplicaAnswer<T> {
        match answer {
            Ok(Some(found)) => {
                self.replica_outcome("found");
                ReplicaAnswer::Found(found)
            }
            Ok(None) => {
                self.replica_outcome("missed");
                ReplicaAnswer::Missed
            }
            Err(error) => {
                tracing::warn!(%error, "public-ID storage: the read replica failed; reading the primary");
                self.replica_outcome("failed");
                replica.skip_until_ms.store(replica.now_ms() + REPLICA_RETRY.as_millis() as u64, Ordering::Relaxed);
                ReplicaAnswer::Failed
            }
        }
    }

    /// The mapping of each internal ID in `format`, creating the missing ones with `make()` and
    /// `type_number`, idempotently: concurrent creates of one internal ID all get the one mapping
    /// that won (whose type the caller compares with the one it asked for). A collision of random
    /// public IDs is retried with a fresh one, never surfaced.
    pub async fn create_batch(
        &self,
        internal_ids: &[u64],
        format: Format,
        type_number: Option<u16>,
        make: &(dyn Fn() -> Result<String, RandomUnavailable> + Sync),
        now_ms: i64,
    ) -> Result<Vec<Mapping>, CreateError> {
        let mut result: Vec<Option<Mapping>> = vec![None; internal_ids.len()];
        for _ in 0..8 {
            let pending: Vec<usize> = (0..internal_ids.len()).filter(|&i| result[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            // Every candidate is drawn before anything is written: a random source that fails
            // stops the create here, with nothing stored from it.
            let mut offered: Vec<(u64, String)> =
                pending.iter().map(|&i| Ok((internal_ids[i], make()?))).collect::<Result<_, RandomUnavailable>>()?;
            // One public ID offered twice in a batch (a random source repeating itself) is offered
            // once: the other internal ID draws again in the next round.
            let mut seen = std::collections::HashSet::with_capacity(offered.len());
            offered.retain(|(_, public_id)| seen.insert(public_id.clone()));
            let inserted = self.insert_and_read(&offered, format, type_number, now_ms);
            let found = self.counted("create", self.within(inserted).await)?;
            let offered_by_id: HashMap<u64, &str> = offered.iter().map(|(id, p)| (*id, p.as_str())).collect();
            for &i in &pending {
                let id = internal_ids[i];
                if let Some((public_id, found_type)) = found.get(&id) {
                    let ours = offered_by_id.get(&id) == Some(&public_id.as_str());
                    let public_id = public_id.clone();
                    let type_number = *found_type;
                    result[i] = Some(Mapping { internal_id: id, format, public_id, type_number, created: ours });
                }
            }
        }
        result
            .into_iter()
            .map(|m| m.ok_or_else(|| sqlx::Error::Protocol("public ID collisions kept repeating".into()).into()))
            .collect()
    }

    /// One statement on PostgreSQL (two when some internal IDs were mapped already), one
    /// transaction of two on SQLite.
    async fn insert_and_read(
        &self,
        offered: &[(u64, String)],
        format: Format,
        type_number: Option<u16>,
        now_ms: i64,
    ) -> Result<HashMap<u64, (String, Option<u16>)>, sqlx::Error> {
        let mut found = HashMap::with_capacity(offered.len());
        let pool = match &self.pool {
            Pool::Sqlite(pool) => return insert_and_read_sqlite(pool, offered, format, type_number, now_ms).await,
            Pool::Postgres(pool) => pool,
        };
        let mut internal_ids = Vec::with_capacity(offered.len());
        let mut public_ids = Vec::with_capacity(offered.len());
        for (id, text) in offered {
            let public_id = as_uuid(format, text)
                .ok_or_else(|| sqlx::Error::Protocol(format!("{text:?} is not a {} public ID", format.as_str())))?;
            internal_ids.push(*id as i64);
            public_ids.push(public_id);
        }
        let statements = statements(format);
        let inserted: Vec<(i64, uuid::Uuid)> = sqlx::query_as(statements.insert)
            .bind(&internal_ids)
            .bind(public_ids)
            .bind(type_column(type_number))
            .fetch_all(pool)
            .await?;
        for (id, public_id) in inserted {
            found.insert(id as u64, (format::stored_text(format, public_id.as_bytes()), type_number));
        }
        // Read after the insert, not in its snapshot: a mapping another create committed while
        // this one waited on its key is seen here, not left for a retry.
        let missing: Vec<i64> = internal_ids.into_iter().filter(|id| !found.contains_key(&(*id as u64))).collect();
        if !missing.is_empty() {
            let existing: Vec<Row> = sqlx::query_as(statements.existing).bind(missing).fetch_all(pool).await?;
            for (id, public_id, found_type) in existing {
                found.insert(id as u64, (format::stored_text(format, public_id.as_bytes()), type_of(found_type)));
            }
        }
        Ok(found)
    }

    /// The internal ID and type number of the stored public ID of `format` with these 16 bytes.
    pub async fn resolve(
        &self,
        format: Format,
        public_id: &[u8; 16],
    ) -> Result<Option<(u64, Option<u16>)>, ResolveError> {
        let found: Result<Option<(i64, Option<i16>)>, sqlx::Error> = match &self.pool {
            Pool::Postgres(pool) => {
                let bytes = public_id;
                let public_id = uuid::Uuid::from_bytes(*public_id);
                // A miss on the replica reads the primary only within the budget of such reads
                // (the permit is held for the read), so misses never take the primary's pool
                // from creates; a replica that failed is not a miss (its reads are the primary's).
                let mut _permit = None;
                if let Some(replica) = self.replica() {
                    let answer = self.within(resolve_on(&replica.pool, format, public_id)).await;
                    match self.answer_of_replica(replica, answer) {
                        ReplicaAnswer::Found(found) => return Ok(Some((found.0 as u64, type_of(found.1)))),
                        ReplicaAnswer::Failed => {}
                        ReplicaAnswer::Missed if format == Format::Uuidv7 && replica.miss_is_final(bytes) => {
                            self.fallback_outcome("final");
                            return Ok(None);
                        }
                        ReplicaAnswer::Missed => match replica.fallbacks.clone().try_acquire_owned() {
                            Ok(permit) => {
                                self.fallback_outcome("read");
                                _permit = Some(permit);
                            }
                            Err(_) => {
                                self.fallback_outcome("refused");
                                return Err(ResolveError::FallbacksBusy);
                            }
                        },
                    }
                }
                self.within(resolve_on(pool, format, public_id)).await
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as("SELECT internal_id, id_type FROM public_ids WHERE public_id = $1 AND format = $2")
                    .bind(format::stored_text(format, public_id))
                    .bind(format.as_str())
                    .fetch_optional(pool)
                    .await
            }
        };
        Ok(self.counted("resolve", found)?.map(|(id, found_type)| (id as u64, type_of(found_type))))
    }

    /// The stored public ID (its text without a type's prefix) and type number of an internal ID
    /// in a format.
    pub async fn lookup(&self, internal_id: u64, format: Format) -> Result<Option<(String, Option<u16>)>, sqlx::Error> {
        let found = match &self.pool {
            Pool::Postgres(pool) => {
                let text = |(public_id, found_type): (uuid::Uuid, Option<i16>)| {
                    (format::stored_text(format, public_id.as_bytes()), type_of(found_type))
                };
                if let Some(replica) = self.replica() {
                    let answer = self.within(lookup_on(&replica.pool, format, internal_id)).await;
                    if let ReplicaAnswer::Found(found) = self.answer_of_replica(replica, answer) {
                        return Ok(Some(text(found)));
                    }
                }
                self.within(lookup_on(pool, format, internal_id)).await.map(|found| found.map(text))
            }
            Pool::Sqlite(pool) => {
                let sql = "SELECT public_id, id_type FROM public_ids WHERE internal_id = $1 AND format = $2";
                sqlx::query_as(sql)
                    .bind(internal_id as i64)
                    .bind(format.as_str())
                    .fetch_optional(pool)
                    .await
                    .map(|found: Option<(String, Option<i16>)>| found.map(|(text, t)| (text, type_of(t))))
            }
        };
        self.counted("lookup", found)
    }

    /// Wrapped data keys by version, oldest first.
    pub async fn wrapped_keys(&self) -> Result<Vec<WrappedKey>, sqlx::Error> {
        let sql = "SELECT version, kms_key_id, wrapped_key, encryption_context FROM public_id_keys ORDER BY version";
        let rows: Result<Vec<KeyRow>, sqlx::Error> = on_pool!(self, |pool| sqlx::query_as(sql).fetch_all(pool).await);
        let rows = self.counted("read_keys", rows)?;
        Ok(rows
            .into_iter()
            .map(|(version, kms_key_id, wrapped, context)| WrappedKey {
                version: version as u8,
                kms_key_id,
                wrapped,
                with_context: context != 0,
            })
            .collect())
    }

    /// Stores a wrapped key (made with the encryption context) as the next version. `false` if
    /// another instance took that version.
    pub async fn add_wrapped_key(
        &self,
        version: u8,
        kms_key_id: &str,
        wrapped: &[u8],
        now_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = "INSERT INTO public_id_keys (version, kms_key_id, wrapped_key, created_at_ms, encryption_context) \
                   VALUES ($1, $2, $3, $4, 1)";
        let inserted = on_pool!(self, |pool| {
            sqlx::query(sql)
                .bind(i64::from(version))
                .bind(kms_key_id)
                .bind(wrapped)
                .bind(now_ms)
                .execute(pool)
                .await
                .map(|_| ())
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(error) if is_unique_violation(&error) => Ok(false),
            Err(error) => self.counted("add_key", Err(error)),
        }
    }

    /// Replaces a version's wrapped form by one made under the encryption context (by `kms_key_id`),
    /// where the stored one was made without.
    pub async fn rewrap(&self, version: u8, kms_key_id: &str, wrapped: &[u8]) -> Result<(), sqlx::Error> {
        let sql = "UPDATE public_id_keys SET wrapped_key = $1, kms_key_id = $2, encryption_context = 1 \
                   WHERE version = $3 AND encryption_context = 0";
        on_pool!(self, |pool| {
            sqlx::query(sql).bind(wrapped).bind(kms_key_id).bind(i64::from(version)).execute(pool).await.map(|_| ())
        })?;
        Ok(())
    }
}

/// A row of `public_id_keys`: version, KMS key, wrapped key, whether under the encryption context.
type KeyRow = (i64, String, Vec<u8>, i64);

/// PostgreSQL's resolve on the primary or the replica.
async fn resolve_on(
    pool: &PgPool,
    format: Format,
    public_id: uuid::Uuid,
) -> Result<Option<(i64, Option<i16>)>, sqlx::Error> {
    let found: Vec<(i64, Option<i16>)> = sqlx::query_as(statements(format).resolve)
        .bind(public_id_key(&public_id))
        .bind(public_id)
        .fetch_all(pool)
        .await?;
    match found[..] {
        [] => Ok(None),
        [mapping] => Ok(Some(mapping)),
        _ => Err(sqlx::Error::Protocol(format!(
            "the {} public ID {public_id} is held by more than one internal ID ({found:?}): not answered",
            format.as_str()
        ))),
    }
}

/// What migration 0003's `public_id_key` makes of a public ID: its last 8 bytes, big-endian, as
/// the `bigint` its index holds.
pub fn public_id_key(public_id: &uuid::Uuid) -> i64 {
    i64::from_be_bytes(public_id.as_bytes()[8..].try_into().expect("8 of 16 bytes"))
}

/// PostgreSQL's lookup on the primary or the replica.
async fn lookup_on(
    pool: &PgPool,
    format: Format,
    internal_id: u64,
) -> Result<Option<(uuid::Uuid, Option<i16>)>, sqlx::Error> {
    sqlx::query_as(statements(format).lookup).bind(internal_id as i64).fetch_optional(pool).await
}

/// SQLite's create: the insert and the read in one transaction (its one connection).
async fn insert_and_read_sqlite(
    pool: &SqlitePool,
    offered: &[(u64, String)],
    format: Format,
    type_number: Option<u16>,
    now_ms: i64,
) -> Result<HashMap<u64, (String, Option<u16>)>, sqlx::Error> {
    let mut found = HashMap::with_capacity(offered.len());
    let mut tx = pool.begin().await?;
    let values: Vec<String> =
        (0..offered.len()).map(|i| format!("(${}, $1, ${}, $2, $3)", 2 * i + 4, 2 * i + 5)).collect();
    let sql = format!(
        "INSERT INTO public_ids (internal_id, format, public_id, created_at_ms, id_type) VALUES {} \
         ON CONFLICT DO NOTHING",
        values.join(", ")
    );
    let mut query = sqlx::query(&sql).bind(format.as_str()).bind(now_ms).bind(type_column(type_number));
    for (id, public) in offered {
        query = query.bind(*id as i64).bind(public.as_str());
    }
    query.execute(&mut *tx).await?;
    let list: Vec<String> = (0..offered.len()).map(|i| format!("${}", i + 2)).collect();
    let sql = format!(
        "SELECT internal_id, public_id, id_type FROM public_ids WHERE format = $1 AND internal_id IN ({})",
        list.join(", ")
    );
    let mut query = sqlx::query_as::<_, (i64, String, Option<i16>)>(&sql).bind(format.as_str());
    for (id, _) in offered {
        query = query.bind(*id as i64);
    }
    for (id, public_id, found_type) in query.fetch_all(&mut *tx).await? {
        found.insert(id as u64, (public_id, type_of(found_type)));
    }
    tx.commit().await?;
    Ok(found)
}

/// One data-key version as stored: only its KMS-wrapped form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedKey {
    pub version: u8,
    /// The KMS key it is wrapped under.
    pub kms_key_id: String,
    pub wrapped: Vec<u8>,
    /// Wrapped under the encryption context ([`crate::kms::encryption_context`]); false only for
    /// a version made before it was used, until `idgen public init` re-wraps it.
    pub with_context: bool,
}
