//! Mappings and wrapped data keys, in PostgreSQL (production) or SQLite (embedded default): one
//! implementation over sqlx `Any`, the same suite run on both.

use std::sync::Arc;
use std::time::Duration;

use idgen_server::database::{Connection, Schema};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

use crate::format::{Format, RandomUnavailable};

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/public_ids/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/public_ids/postgres");

/// The service's tables and migrations.
const SCHEMA: Schema = Schema {
    service: "public-ID service",
    // What the running service does: adds mappings and reads them, reads the wrapped data keys.
    // A mapping is never changed or deleted; data keys are made and re-wrapped by `idgen public
    // init` and `rotate-key`, under the role that owns the schema.
    tables: &[("public_ids", "SELECT, INSERT"), ("public_id_keys", "SELECT")],
    sequences: &[],
    sqlite: &SQLITE,
    postgres: &POSTGRES,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub internal_id: u64,
    pub format: Format,
    pub public_id: String,
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
}

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
}

#[derive(Clone)]
pub struct PublicIdStore {
    pool: AnyPool,
    postgres: bool,
    metrics: Arc<StoreMetrics>,
}

fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

impl PublicIdStore {
    /// The database pool's open connections and how many of them are idle (for `/metrics`).
    pub fn pool_connections(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
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
        let asked = sqlx::query("SELECT 1").fetch_one(&self.pool);
        let answer = match tokio::time::timeout(within, asked).await {
            Ok(answer) => answer.map(|_| ()),
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
        Self::connect_waiting(url, idgen::open_lock::DEFAULT_OPEN_TIMEOUT).await
    }

    /// [`Self::connect`], waiting up to `within` for other processes opening the same SQLite
    /// file ([`idgen::open_lock`]).
    pub async fn connect_waiting(url: &str, within: std::time::Duration) -> anyhow::Result<Self> {
        Self::initialize(url, within, None).await?;
        Self::open(url, within).await
    }

    /// The migrations (`idgen public init`): makes an empty database the service's, or applies
    /// those still pending; refuses another service's database. With `runtime_role`
    /// (PostgreSQL), that role (made with the password, if one is given) is then granted exactly
    /// what the service uses.
    pub async fn initialize(
        url: &str,
        within: std::time::Duration,
        runtime_role: Option<(&str, Option<&str>)>,
    ) -> anyhow::Result<()> {
        // Held until the file is set up.
        let _one_opener = idgen::open_lock::lock_for_open_url(url, within).await?;
        let connection = Connection::connect(url).await?;
        let mut done = connection.migrate(&SCHEMA).await;
        if let (Ok(()), Some((role, password))) = (&done, runtime_role) {
            done = connection.grant(&SCHEMA, role, password).await;
        }
        connection.close().await;
        done
    }

    /// Opens the service's database to serve from it. Never initializes: an empty database, one
    /// with migrations pending or another service's is refused ([`idgen::config::Refused`], saying
    /// what to run).
    pub async fn open(url: &str, within: std::time::Duration) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        {
            let _one_opener = idgen::open_lock::lock_for_open_url(url, within).await?;
            let connection = Connection::connect(url).await?;
            let refusal = connection.refusal(&SCHEMA, "idgen public init --config <this file>").await;
            connection.close().await;
            if let Some(why) = refusal? {
                return Err(idgen::config::Refused(format!(
                    "public-ID database {}: refusing to start: {why}",
                    idgen::config::redacted_url(url)
                ))
                .into());
            }
        }
        let postgres = url.starts_with("postgres");
        let connections = if postgres { 16 } else { 1 };
        let pool = AnyPoolOptions::new().max_connections(connections).connect(url).await?;
        Ok(PublicIdStore { pool, postgres, metrics: Arc::default() })
    }

    /// The mapping of each internal ID in `format`, creating the missing ones with `make()`,
    /// idempotently: concurrent creates of one internal ID all get the one mapping that won. A
    /// collision of random public IDs is retried with a fresh one, never surfaced.
    pub async fn create_batch(
        &self,
        internal_ids: &[u64],
        format: Format,
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
            let offered: Vec<(u64, String)> =
                pending.iter().map(|&i| Ok((internal_ids[i], make()?))).collect::<Result<_, RandomUnavailable>>()?;
            let found = self.counted("create", self.insert_and_read(&offered, format, now_ms).await)?;
            for &i in &pending {
                let id = internal_ids[i];
                if let Some(public_id) = found.get(&id) {
                    let ours = offered.iter().any(|(o, p)| *o == id && p == public_id);
                    result[i] = Some(Mapping { internal_id: id, format, public_id: public_id.clone(), created: ours });
                }
            }
        }
        result
            .into_iter()
            .map(|m| m.ok_or_else(|| sqlx::Error::Protocol("public ID collisions kept repeating".into()).into()))
            .collect()
    }

    /// One statement on PostgreSQL (a data-modifying CTE), one transaction of two on SQLite.
    async fn insert_and_read(
        &self,
        offered: &[(u64, String)],
        format: Format,
        now_ms: i64,
    ) -> Result<std::collections::HashMap<u64, String>, sqlx::Error> {
        let mut found = std::collections::HashMap::new();
        if self.postgres {
            let values: Vec<String> =
                (0..offered.len()).map(|i| format!("(${}::BIGINT, ${}::TEXT)", 2 * i + 3, 2 * i + 4)).collect();
            let sql = format!(
                "WITH offered (internal_id, public_id) AS (VALUES {}), \
                 inserted AS (INSERT INTO public_ids (internal_id, format, public_id, created_at_ms) \
                              SELECT internal_id, $1, public_id, $2 FROM offered ON CONFLICT DO NOTHING \
                              RETURNING internal_id, public_id) \
                 SELECT internal_id, public_id FROM inserted \
                 UNION ALL SELECT p.internal_id, p.public_id FROM public_ids p JOIN offered o ON p.internal_id = o.internal_id \
                 WHERE p.format = $1",
                values.join(", ")
            );
            let mut query = sqlx::query(&sql).bind(format.as_str()).bind(now_ms);
            for (id, public) in offered {
                query = query.bind(*id as i64).bind(public.clone());
            }
            for row in query.fetch_all(&self.pool).await? {
                let id: i64 = row.try_get("internal_id")?;
                found.insert(id as u64, row.try_get("public_id")?);
            }
            return Ok(found);
        }
        let mut tx = self.pool.begin().await?;
        let values: Vec<String> =
            (0..offered.len()).map(|i| format!("(${}, $1, ${}, $2)", 2 * i + 3, 2 * i + 4)).collect();
        let sql = format!(
            "INSERT INTO public_ids (internal_id, format, public_id, created_at_ms) VALUES {} ON CONFLICT DO NOTHING",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql).bind(format.as_str()).bind(now_ms);
        for (id, public) in offered {
            query = query.bind(*id as i64).bind(public.clone());
        }
        query.execute(&mut *tx).await?;
        let list: Vec<String> = (0..offered.len()).map(|i| format!("${}", i + 2)).collect();
        let sql = format!(
            "SELECT internal_id, public_id FROM public_ids WHERE format = $1 AND internal_id IN ({})",
            list.join(", ")
        );
        let mut query = sqlx::query(&sql).bind(format.as_str());
        for (id, _) in offered {
            query = query.bind(*id as i64);
        }
        for row in query.fetch_all(&mut *tx).await? {
            let id: i64 = row.try_get("internal_id")?;
            found.insert(id as u64, row.try_get("public_id")?);
        }
        tx.commit().await?;
        Ok(found)
    }

    /// The internal ID a stored public ID maps to.
    pub async fn resolve(&self, public_id: &str) -> Result<Option<u64>, sqlx::Error> {
        let row = sqlx::query("SELECT internal_id FROM public_ids WHERE public_id = $1")
            .bind(public_id)
            .fetch_optional(&self.pool)
            .await;
        let row = self.counted("resolve", row)?;
        row.map(|r| r.try_get::<i64, _>("internal_id").map(|id| id as u64)).transpose()
    }

    /// The stored public ID of an internal ID in a format.
    pub async fn lookup(&self, internal_id: u64, format: Format) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query("SELECT public_id FROM public_ids WHERE internal_id = $1 AND format = $2")
            .bind(internal_id as i64)
            .bind(format.as_str())
            .fetch_optional(&self.pool)
            .await;
        let row = self.counted("lookup", row)?;
        row.map(|r| r.try_get("public_id")).transpose()
    }

    /// Wrapped data keys by version, oldest first.
    pub async fn wrapped_keys(&self) -> Result<Vec<WrappedKey>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT version, kms_key_id, wrapped_key, encryption_context FROM public_id_keys ORDER BY version",
        )
        .fetch_all(&self.pool)
        .await;
        let rows = self.counted("read_keys", rows)?;
        rows.iter()
            .map(|r| {
                Ok(WrappedKey {
                    version: r.try_get::<i64, _>("version")? as u8,
                    kms_key_id: r.try_get("kms_key_id")?,
                    wrapped: r.try_get("wrapped_key")?,
                    with_context: r.try_get::<i64, _>("encryption_context")? != 0,
                })
            })
            .collect()
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
        let inserted = sqlx::query(
            "INSERT INTO public_id_keys (version, kms_key_id, wrapped_key, created_at_ms, encryption_context) \
             VALUES ($1, $2, $3, $4, 1)",
        )
        .bind(i64::from(version))
        .bind(kms_key_id)
        .bind(wrapped.to_vec())
        .bind(now_ms)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(error) if is_unique_violation(&error) => Ok(false),
            Err(error) => self.counted("add_key", Err(error)),
        }
    }

    /// Replaces a version's wrapped form by one made under the encryption context (by `kms_key_id`),
    /// where the stored one was made without.
    pub async fn rewrap(&self, version: u8, kms_key_id: &str, wrapped: &[u8]) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE public_id_keys SET wrapped_key = $1, kms_key_id = $2, encryption_context = 1 \
             WHERE version = $3 AND encryption_context = 0",
        )
        .bind(wrapped.to_vec())
        .bind(kms_key_id)
        .bind(i64::from(version))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
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
