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

//!
//! The rooms: `mod.rs` (here) opens and initializes the database and holds the store;
//! [`mappings`] creates, resolves and looks up; [`replica`] reads the replica first and holds
//! its misses to a budget; [`keys`] keeps the wrapped data keys; [`check`] the check keys and
//! the legacy filter; [`legacy`] the mappings made before 16-byte storage; [`metrics`] what
//! `/metrics` shows. All hold the services' one [`Pool`] (each database's own driver).

use std::sync::Arc;
use std::time::Duration;

use idgen_server::database::{Pool, Schema};
use idgen_server::on_pool;

use crate::format::{Format, RandomUnavailable};

mod budget;
pub mod check;
pub mod keys;
pub mod legacy;
pub mod mappings;
pub mod metrics;
pub mod replica;

pub use idgen_server::database::PoolSettings;
pub use keys::WrappedKey;
pub use mappings::public_id_key;
pub use metrics::{
    FALLBACK_OUTCOMES, REPLICA_OUTCOMES, ReplicaOutcomeLabel, STORAGE_OPERATIONS, StorageOperationLabel, StoreMetrics,
};
pub use replica::{FallbackSettings, REPLICA_RETRY};

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

/// Why a create did not finish: the database, or the random source the public IDs are drawn
/// from (then nothing drawn from it was stored).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Storage(#[from] sqlx::Error),
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
}

/// Why a resolve or a lookup was not answered: the database, or the budget of the primary's
/// reads ([`budget`]), all taken (counted, not logged: a flood would fill the log).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Storage(#[from] sqlx::Error),
    #[error("the primary's reads for resolves and lookups are all taken")]
    FallbacksBusy,
}

#[derive(Clone)]
pub struct PublicIdStore {
    pool: Pool,
    /// The read replica resolves and lookups ask first, if one is configured.
    replica: Option<replica::Replica>,
    /// What the primary's reads by resolves and lookups may take ([`budget`]); none: unbounded
    /// (the CLI's tasks, SQLite).
    primary_reads: Option<Arc<budget::PrimaryReads>>,
    metrics: Arc<StoreMetrics>,
    /// The longest a call may take, whatever the database does ([`Self::within`]).
    deadline: Duration,
}

impl PublicIdStore {
    /// The database pool's open connections and how many of them are idle (for `/metrics`).
    pub fn pool_connections(&self) -> (u32, usize) {
        self.pool.connections()
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
        let asked = async { on_pool!(&self.pool, |pool| sqlx::query("SELECT 1").execute(pool).await.map(|_| ())) };
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
        let connection = Pool::connect_one(url).await?;
        let done = async {
            let new_database = connection.found(&SCHEMA).await? == idgen_server::database::Found::Empty;
            connection.migrate(&SCHEMA).await?;
            check::initialize(&connection, new_database, idgen::system_unix_ms()).await?;
            let copied = match &connection {
                Pool::Postgres(pool) => legacy::copy(pool, legacy::BATCH).await?,
                Pool::Sqlite(_) => None,
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
            let connection = Pool::connect_one(url).await?;
            let mut refusal = connection.refusal(&SCHEMA, init).await;
            if let (Ok(None), Pool::Postgres(pool)) = (&refusal, &connection) {
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
        let pool = Pool::open(url, settings).await?;
        // statement_timeout is the server's: a database that is gone without a word (a partition,
        // packets dropped) would keep a call waiting on TCP for minutes. This bounds it here.
        let deadline = settings.acquire_timeout + settings.statement_timeout + Duration::from_secs(1);
        Ok(PublicIdStore { pool, replica: None, primary_reads: None, metrics: Arc::default(), deadline })
    }

    /// Holds the primary's reads by resolves and lookups to `reads` at once, each caller to its
    /// share of them, each waited for at most `wait` ([`budget`]). PostgreSQL only: SQLite's
    /// pool is one connection, which creates share anyway.
    pub fn with_primary_budget(mut self, reads: u32, wait: Duration) -> Self {
        if matches!(self.pool, Pool::Postgres(_)) {
            self.primary_reads = Some(budget::PrimaryReads::new(reads, wait));
        }
        self
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
}
