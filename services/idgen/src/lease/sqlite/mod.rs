//! The lease table in a SQLite file: the embedded default for one host.
//!
//! Each conditional write of SPEC §2 is one SQL statement whose `WHERE` clause is the DynamoDB
//! condition, so it is atomic across every process sharing the file (WAL mode, busy timeout).
//! The audit record is written in the same transaction as the change it records.
//!
//! The tables are created here (`CREATE TABLE IF NOT EXISTS`) rather than by a migration because
//! their names are configuration, exactly as DynamoDB table names are.
//!
//! Two things SQLite's locking cannot see are checked here ([`opened`]): a process forked from one
//! that has the file open is refused it (its SQLite would take no real lock), and before every
//! claim and renewal the file at the path must still be the one opened (a copy put in its place
//! is [`StoreError::Replaced`]: the lease written in the old one, nobody opening the path sees).

mod opened;

pub use opened::FileIdentity;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::lease::genesis::{self, Genesis, GenesisHow, GenesisRequest, GenesisWrite};
use crate::lease::{
    AuditEvent, AuditKind, ClaimOutcome, ClaimToken, Conditional, LeaseRow, LeaseStore, Lift, LiftOutcome,
    QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError,
};

#[derive(Clone)]
pub struct SqliteLeaseStore {
    pool: SqlitePool,
    table: String,
    audit: String,
    /// The database file, as SQLite resolved it.
    file: String,
    /// The file this store opened (none for a pool handed in, [`SqliteLeaseStore::with_pool`]).
    opened: Option<Arc<OpenedFile>>,
}

/// What [`SqliteLeaseStore::open`] opened: its path, the file that was there, and its place in
/// the process's record of open files, left when the pool is closed.
struct OpenedFile {
    path: PathBuf,
    identity: FileIdentity,
    entry: Mutex<Option<opened::Opened>>,
}

/// The columns every query reads a lease row from.
const ROW: &str = "machine_id, holder, lease_expiry, lease_epoch, claim_token, expiry_before_quarantine";

/// The file's table of genesis records, one per lease table in it ([`crate::lease::genesis`]). No
/// lease table may have this name (`GeneratorConfig::validate_settings`).
pub const GENESIS_TABLE: &str = "idgen-genesis";

/// How often a genesis write is tried again when the record changed between its read and the
/// conditional write.
const GENESIS_ATTEMPTS: usize = 5;

fn unavailable(error: sqlx::Error) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

/// Table names go into SQL as quoted identifiers, so they are restricted to a safe alphabet.
fn check_table_name(name: &str) -> Result<(), StoreError> {
    let ok = (1..=200).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!("table name {name:?} must be 1–200 of A–Z a–z 0–9 - _ .")))
    }
}

/// Filesystems whose locking SQLite cannot rely on (`statfs(2)` magic numbers): network
/// filesystems and FUSE. On them two processes can both see their conditional write succeed.
const SHARED_FILESYSTEMS: &[(u64, &str)] = &[
    (0x6969, "NFS"),
    (0x517b, "SMB"),
    (0xff53_4d42, "CIFS"),
    (0xfe53_4d42, "SMB2"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9P"),
    (0x00c3_6400, "Ceph"),
    (0x5346_414f, "AFS"),
    (0x7375_7245, "Coda"),
    (0x0bd0_0bd0, "Lustre"),
    (0x0116_1970, "GFS2"),
    (0x7461_636f, "OCFS2"),
];

/// The kind of filesystem a `statfs` magic number names, if it is one SQLite's locking does not
/// hold on.
pub fn shared_filesystem(magic: u64) -> Option<&'static str> {
    SHARED_FILESYSTEMS.iter().find(|(m, _)| *m == magic & 0xffff_ffff).map(|(_, name)| *name)
}

/// Refuses a lease file on a network or FUSE filesystem. Checks the file, or the nearest
/// directory above it that exists.
#[cfg(target_os = "linux")]
pub fn check_local_filesystem(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let absolute =
        std::path::absolute(path).map_err(|e| StoreError::Misconfigured(format!("{}: {e}", path.display())))?;
    let existing = absolute.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes())
        .map_err(|_| StoreError::Misconfigured(format!("{}: a NUL byte in the path", path.display())))?;
    // SAFETY: statfs writes into the zeroed struct we own; the path is a valid C string.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        let error = std::io::Error::last_os_error();
        return Err(StoreError::Misconfigured(format!("statfs {}: {error}", existing.display())));
    }
    match shared_filesystem(stat.f_type as u64) {
        Some(kind) => Err(StoreError::Misconfigured(format!(
            "{} is on a {kind} filesystem, where SQLite's locking does not make a lease write atomic \
             across processes: put the lease file on a local disk (or use DynamoDB)",
            path.display()
        ))),
        None => Ok(()),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn check_local_filesystem(_path: &Path) -> Result<(), StoreError> {
    Ok(())
}

impl SqliteLeaseStore {
    /// Opens (creating if needed) the file and the lease and audit tables. The file must be on a
    /// local filesystem ([`check_local_filesystem`]).
    pub async fn open(path: &Path, table: &str) -> Result<Self, StoreError> {
        Self::open_waiting(path, table, crate::lease::open_lock::DEFAULT_OPEN_TIMEOUT).await
    }

    /// [`Self::open`], waiting up to `within` for other processes opening the same file
    /// ([`crate::lease::open_lock`]). Refused in a process forked from one that has the file open
    /// ([`opened`]).
    pub async fn open_waiting(path: &Path, table: &str, within: Duration) -> Result<Self, StoreError> {
        check_local_filesystem(path)?;
        let entry = opened::Opened::enter(path)?;
        // Held until the tables are made: see open_lock.
        let (pool, _one_opener) = match Self::connect(path, within).await {
            Ok(connected) => connected,
            // Nothing of the file is open: its entry goes.
            Err(error) => {
                entry.closed();
                return Err(error);
            }
        };
        let resolved = opened::resolved(path);
        let identity = match FileIdentity::of(&resolved) {
            Ok(Some(identity)) => Ok(identity),
            Ok(None) => Err(StoreError::Replaced(format!("{} was removed as it was opened", resolved.display()))),
            Err(error) => Err(StoreError::Unavailable(format!("stat {}: {error}", resolved.display()))),
        };
        let identity = match identity {
            Ok(identity) => identity,
            Err(error) => {
                pool.close().await;
                entry.closed();
                return Err(error);
            }
        };
        entry.set_identity(identity);
        let opened = Arc::new(OpenedFile { path: resolved, identity, entry: Mutex::new(Some(entry)) });
        let mut store = match Self::with_pool(pool.clone(), table).await {
            Ok(store) => store,
            Err(error) => {
                pool.close().await;
                if let Some(entry) = opened.entry.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                    entry.closed();
                }
                return Err(error);
            }
        };
        store.opened = Some(opened);
        Ok(store)
    }

    /// The file's pool, once the other processes opening it let this one in, and the open lock.
    async fn connect(
        path: &Path,
        within: Duration,
    ) -> Result<(SqlitePool, crate::lease::open_lock::OpenLock), StoreError> {
        let one_opener = crate::lease::open_lock::lock_for_open(path, within)
            .await
            .map_err(|error| StoreError::Unavailable(error.to_string()))?;
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(unavailable)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        // The connections are kept for the store's life: a pool that retires its last one closes
        // the file, and SQLite's last close in a process checkpoints and deletes the WAL when it
        // can (which only a fork's missing locks would let it do under another process); nothing
        // is gained by reopening a local file.
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(options)
            .await
            .map_err(unavailable)?;
        Ok((pool, one_opener))
    }

    /// Uses an existing pool (several tables can share one file).
    pub async fn with_pool(pool: SqlitePool, table: &str) -> Result<Self, StoreError> {
        check_table_name(table)?;
        let audit = format!("{table}-audit");
        let file: String = sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(&pool)
            .await
            .map_err(unavailable)?;
        let store = SqliteLeaseStore { pool, table: table.to_owned(), audit, file, opened: None };
        store.create_tables().await?;
        Ok(store)
    }

    /// Whether the file at the path is still the one opened: a copy put in its place (a restore,
    /// `cp` of another file over a rename, a file made again) is another table, and the lease this
    /// process holds was written in the old one, which nobody opening the path sees.
    fn check_same_file(&self) -> Result<(), StoreError> {
        let Some(opened) = &self.opened else { return Ok(()) };
        let now = FileIdentity::of(&opened.path)
            .map_err(|error| StoreError::Unavailable(format!("stat {}: {error}", opened.path.display())))?;
        if now == Some(opened.identity) {
            return Ok(());
        }
        let what = match now {
            Some(other) => format!("another file is there now ({other}; this process opened {})", opened.identity),
            None => "it was removed".to_owned(),
        };
        Err(StoreError::Replaced(format!(
            "the lease file {} is not the one this process opened: {what}. The leases of this process are in \
             the old file, which no process opening the path sees: nothing more is claimed or renewed through this \
             handle. Before any process claims in the file now at the path, every process that had the old one \
             open must be stopped (runbooks/lease-table-restore.md)",
            opened.path.display()
        )))
    }

    async fn create_tables(&self) -> Result<(), StoreError> {
        let (table, audit) = (&self.table, &self.audit);
        let ddl = format!(
            r#"CREATE TABLE IF NOT EXISTS "{table}" (
                   machine_id   INTEGER PRIMARY KEY,
                   holder       TEXT    NOT NULL,
                   lease_expiry INTEGER NOT NULL,
                   lease_epoch  INTEGER NOT NULL
               );
               CREATE TABLE IF NOT EXISTS "{audit}" (
                   seq          INTEGER PRIMARY KEY AUTOINCREMENT,
                   machine_id   INTEGER NOT NULL,
                   event        TEXT    NOT NULL,
                   holder       TEXT    NOT NULL,
                   lease_epoch  INTEGER NOT NULL,
                   lease_expiry INTEGER NOT NULL,
                   at_unix_ms   INTEGER NOT NULL
               );
               CREATE INDEX IF NOT EXISTS "{audit}-by-machine" ON "{audit}" (machine_id, at_unix_ms);
               CREATE INDEX IF NOT EXISTS "{audit}-by-time" ON "{audit}" (at_unix_ms);
               CREATE TABLE IF NOT EXISTS "{GENESIS_TABLE}" (
                   lease_table  TEXT    PRIMARY KEY,
                   table_id     TEXT    NOT NULL,
                   registry_id  TEXT,
                   how          TEXT    NOT NULL,
                   adopted_from TEXT,
                   written_by   TEXT    NOT NULL,
                   at_unix_ms   INTEGER NOT NULL
               );"#
        );
        sqlx::raw_sql(&ddl).execute(&self.pool).await.map_err(unavailable)?;
        // Files made before claim tokens and kept quarantine expiries get the two columns. Several
        // processes may open an old file at once: a column another one just added is fine.
        for column in ["claim_token TEXT", "expiry_before_quarantine INTEGER"] {
            let added =
                sqlx::raw_sql(&format!(r#"ALTER TABLE "{table}" ADD COLUMN {column}"#)).execute(&self.pool).await;
            match added {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) if e.message().contains("duplicate column") => {}
                Err(error) => return Err(unavailable(error)),
            }
        }
        Ok(())
    }

    /// Records an event whose outcome is already decided (a renewal refused): a lost record
    /// must not turn that outcome into an error the keeper would act on, so it is logged loudly.
    async fn record_or_log(&self, event: &AuditEvent) {
        if let Err(error) = self.audit(&self.pool, event).await {
            tracing::error!(
                %error,
                table = %self.audit,
                "audit record lost: {} of machine {} by {}",
                event.kind.as_str(),
                event.machine_id,
                event.holder
            );
        }
    }

    /// Records `event` in the transaction that made the change, then commits both.
    async fn commit_audited(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Sqlite>,
        event: &AuditEvent,
    ) -> Result<(), StoreError> {
        self.audit(&mut *tx, event).await?;
        tx.commit().await.map_err(unavailable)
    }

    /// The lease an operator's write (`kind`: a quarantine, a lift) left in `row`, committed with
    /// its audit record, which carries the epoch and expiry as written.
    async fn commit_operator_write(
        &self,
        tx: sqlx::Transaction<'_, sqlx::Sqlite>,
        row: &sqlx::sqlite::SqliteRow,
        kind: AuditKind,
        machine: u32,
        operator: &str,
        now_unix_ms: i64,
    ) -> Result<LeaseRow, StoreError> {
        let lease = row_to_lease(row)?;
        let event = AuditEvent::new(kind, machine, operator, lease.lease_epoch, lease.lease_expiry, now_unix_ms);
        self.commit_audited(tx, &event).await?;
        Ok(lease)
    }

    async fn audit<'c, E>(&self, executor: E, event: &AuditEvent) -> Result<(), StoreError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
    {
        let sql = format!(
            r#"INSERT INTO "{}" (machine_id, event, holder, lease_epoch, lease_expiry, at_unix_ms)
               VALUES (?, ?, ?, ?, ?, ?)"#,
            self.audit
        );
        sqlx::query(&sql)
            .bind(event.machine_id)
            .bind(event.kind.as_str())
            .bind(&event.holder)
            .bind(event.lease_epoch as i64)
            .bind(event.lease_expiry)
            .bind(event.at_unix_ms)
            .execute(executor)
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

fn row_to_genesis(row: &sqlx::sqlite::SqliteRow) -> Result<Genesis, StoreError> {
    let how: String = row.try_get("how").map_err(unavailable)?;
    let from: Option<String> = row.try_get("adopted_from").map_err(unavailable)?;
    Ok(Genesis {
        table_id: row.try_get("table_id").map_err(unavailable)?,
        registry_id: row.try_get("registry_id").map_err(unavailable)?,
        how: GenesisHow::parse(&how, from).ok_or_else(|| StoreError::Invalid(format!("genesis how = {how:?}")))?,
        by: row.try_get("written_by").map_err(unavailable)?,
        at_unix_ms: row.try_get("at_unix_ms").map_err(unavailable)?,
        table_created_unix_ms: None,
    })
}

fn row_to_lease(row: &sqlx::sqlite::SqliteRow) -> Result<LeaseRow, StoreError> {
    let machine: i64 = row.try_get("machine_id").map_err(unavailable)?;
    let epoch: i64 = row.try_get("lease_epoch").map_err(unavailable)?;
    Ok(LeaseRow {
        machine_id: u32::try_from(machine).map_err(|_| StoreError::Invalid(format!("machine_id {machine}")))?,
        holder: row.try_get("holder").map_err(unavailable)?,
        lease_expiry: row.try_get("lease_expiry").map_err(unavailable)?,
        lease_epoch: u64::try_from(epoch).map_err(|_| StoreError::Invalid(format!("lease_epoch {epoch}")))?,
        claim_token: row.try_get("claim_token").map_err(unavailable)?,
        expiry_before_quarantine: row.try_get("expiry_before_quarantine").map_err(unavailable)?,
    })
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    fn describe(&self) -> String {
        format!("sqlite table {}", self.table)
    }

    fn table_key(&self) -> String {
        format!("sqlite:{}:{}", self.file, self.table)
    }

    fn table_name(&self) -> String {
        self.table.clone()
    }

    async fn genesis(&self) -> Result<Option<Genesis>, StoreError> {
        let sql = format!(
            r#"SELECT table_id, registry_id, how, adopted_from, written_by, at_unix_ms FROM "{GENESIS_TABLE}"
                WHERE lease_table = ?"#
        );
        let row = sqlx::query(&sql).bind(&self.table).fetch_optional(&self.pool).await.map_err(unavailable)?;
        row.as_ref().map(row_to_genesis).transpose()
    }

    async fn record_genesis(&self, request: &GenesisRequest, now_unix_ms: i64) -> Result<Genesis, StoreError> {
        for _ in 0..GENESIS_ATTEMPTS {
            let existing = self.genesis().await?;
            let write = genesis::decide(existing.as_ref(), None, request, &self.table, now_unix_ms)
                .map_err(StoreError::Misconfigured)?;
            let new = match write {
                GenesisWrite::Keep(genesis) => return Ok(genesis),
                GenesisWrite::Put(genesis) => genesis,
            };
            // Written over the record read, only if it is still that one.
            let sql = format!(
                r#"INSERT INTO "{GENESIS_TABLE}"
                       (lease_table, table_id, registry_id, how, adopted_from, written_by, at_unix_ms)
                       VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                   ON CONFLICT (lease_table) DO UPDATE
                      SET table_id = excluded.table_id, registry_id = excluded.registry_id, how = excluded.how,
                          adopted_from = excluded.adopted_from, written_by = excluded.written_by,
                          at_unix_ms = excluded.at_unix_ms
                    WHERE ?8 AND table_id = ?9 AND registry_id IS ?10 AND at_unix_ms = ?11"#
            );
            let done = sqlx::query(&sql)
                .bind(&self.table)
                .bind(&new.table_id)
                .bind(&new.registry_id)
                .bind(new.how.kind())
                .bind(new.how.adopted_from())
                .bind(&new.by)
                .bind(new.at_unix_ms)
                .bind(existing.is_some())
                .bind(existing.as_ref().map(|e| e.table_id.clone()))
                .bind(existing.as_ref().and_then(|e| e.registry_id.clone()))
                .bind(existing.as_ref().map(|e| e.at_unix_ms))
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
            if done.rows_affected() == 1 {
                return Ok(new);
            }
        }
        Err(StoreError::Unavailable(format!(
            "the genesis of {} changed under {GENESIS_ATTEMPTS} writes in a row; try again",
            self.table
        )))
    }

    async fn close(&self) {
        self.pool.close().await;
        // Closed: a process forked from this one from now on may open the file, once the last of
        // its connections is really closed.
        if let Some(opened) = &self.opened {
            let entry = opened.entry.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            if let Some(entry) = entry {
                entry.released(opened.identity, Duration::from_secs(2)).await;
            }
        }
    }

    async fn check_claimable(&self) -> Result<Genesis, StoreError> {
        self.check_same_file()?;
        self.genesis()
            .await?
            .ok_or_else(|| StoreError::Misconfigured(genesis::missing_in_file(&self.table, &self.file)))
    }

    async fn claim_as(
        &self,
        machine: u32,
        holder: &str,
        token: &ClaimToken,
        now_unix_ms: i64,
        expiry_unix_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check_same_file()?;
        let t = &self.table;
        let sql = format!(
            r#"INSERT INTO "{t}" (machine_id, holder, lease_expiry, lease_epoch, claim_token) VALUES (?1, ?2, ?3, 1, ?5)
               ON CONFLICT (machine_id) DO UPDATE
                  SET holder = excluded.holder,
                      lease_expiry = excluded.lease_expiry,
                      lease_epoch = "{t}".lease_epoch + 1,
                      claim_token = excluded.claim_token,
                      expiry_before_quarantine = NULL
                WHERE "{t}".lease_expiry < ?4
               RETURNING {ROW}"#
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(machine)
            .bind(holder)
            .bind(expiry_unix_ms)
            .bind(now_unix_ms)
            .bind(token.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let Some(row) = row else {
            drop(tx);
            // Our own earlier attempt whose answer was lost (its audit record committed with it).
            return Ok(match self.get(machine).await? {
                Some(row) if row.claimed_by(holder, token) => ClaimOutcome::Claimed(row),
                _ => ClaimOutcome::Taken,
            });
        };
        let lease = row_to_lease(&row)?;
        let event = AuditEvent::new(AuditKind::Claim, machine, holder, lease.lease_epoch, expiry_unix_ms, now_unix_ms);
        self.commit_audited(tx, &event).await?;
        Ok(ClaimOutcome::Claimed(lease))
    }

    async fn renew(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        new_expiry_unix_ms: i64,
        live_after_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        self.check_same_file()?;
        let sql = format!(
            r#"UPDATE "{}" SET lease_expiry = ?1
                WHERE machine_id = ?2 AND holder = ?3 AND lease_epoch = ?4 AND lease_expiry < ?1
                  AND lease_expiry > ?5"#,
            self.table
        );
        let done = sqlx::query(&sql)
            .bind(new_expiry_unix_ms)
            .bind(machine)
            .bind(holder)
            .bind(epoch as i64)
            .bind(live_after_unix_ms)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        if done.rows_affected() == 1 {
            return Ok(Conditional::Applied);
        }
        let current = self.get(machine).await?;
        if current.is_some_and(|row| row.renewed_by(holder, epoch, new_expiry_unix_ms)) {
            return Ok(Conditional::Applied);
        }
        // The lease is lost: that must reach the keeper (which stops issuing at once) even if the
        // audit record cannot be written.
        let event = AuditEvent::new(AuditKind::RenewFailed, machine, holder, epoch, new_expiry_unix_ms, now_unix_ms);
        self.record_or_log(&event).await;
        Ok(Conditional::ConditionFailed)
    }

    async fn release(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        expiry_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let sql = format!(
            r#"UPDATE "{}" SET lease_expiry = ?1 WHERE machine_id = ?2 AND holder = ?3 AND lease_epoch = ?4"#,
            self.table
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let done = sqlx::query(&sql)
            .bind(expiry_unix_ms)
            .bind(machine)
            .bind(holder)
            .bind(epoch as i64)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        if done.rows_affected() != 1 {
            return Ok(Conditional::ConditionFailed);
        }
        let event = AuditEvent::new(AuditKind::Release, machine, holder, epoch, expiry_unix_ms, now_unix_ms);
        self.commit_audited(tx, &event).await?;
        Ok(Conditional::Applied)
    }

    async fn quarantine(&self, machine: u32, operator: &str, now_unix_ms: i64) -> Result<LeaseRow, StoreError> {
        let t = &self.table;
        // SET expressions read the row as it was, so the kept expiry is the one before this write;
        // a second quarantine keeps the first one's, and a number nobody held keeps 0.
        let sql = format!(
            r#"INSERT INTO "{t}" (machine_id, holder, lease_expiry, lease_epoch, expiry_before_quarantine)
                    VALUES (?1, ?2, ?3, 1, 0)
               ON CONFLICT (machine_id) DO UPDATE
                  SET holder = excluded.holder,
                      lease_expiry = excluded.lease_expiry,
                      lease_epoch = "{t}".lease_epoch + 1,
                      claim_token = NULL,
                      expiry_before_quarantine = CASE WHEN "{t}".holder = ?2
                          THEN "{t}".expiry_before_quarantine ELSE "{t}".lease_expiry END
               RETURNING {ROW}"#
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(machine)
            .bind(QUARANTINED)
            .bind(QUARANTINE_EXPIRY_UNIX_MS)
            .fetch_one(&mut *tx)
            .await
            .map_err(unavailable)?;
        self.commit_operator_write(tx, &row, AuditKind::Quarantine, machine, operator, now_unix_ms).await
    }

    async fn release_quarantine(
        &self,
        machine: u32,
        operator: &str,
        lift: Lift,
        now_unix_ms: i64,
    ) -> Result<LiftOutcome, StoreError> {
        // A kept expiry of the quarantine's own (a quarantine that kept nothing, quarantined
        // again by a tool that copies the expiry it replaces) is no kept expiry either.
        let sql = format!(
            r#"UPDATE "{}" SET holder = ?1,
                      lease_expiry = MAX(COALESCE(CASE WHEN expiry_before_quarantine < ?6
                          THEN expiry_before_quarantine END, ?2), ?2),
                      lease_epoch = lease_epoch + 1,
                      expiry_before_quarantine = NULL
                WHERE machine_id = ?3 AND holder = ?4 AND (expiry_before_quarantine < ?6 OR ?5)
               RETURNING {ROW}"#,
            self.table
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(format!("released-by:{operator}"))
            .bind(lift.min_expiry_unix_ms)
            .bind(machine)
            .bind(QUARANTINED)
            .bind(lift.holder_stopped)
            .bind(QUARANTINE_EXPIRY_UNIX_MS)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let Some(row) = row else {
            drop(tx);
            return Ok(match self.get(machine).await? {
                Some(row) if row.holder == QUARANTINED => LiftOutcome::NoKeptExpiry,
                _ => LiftOutcome::NotQuarantined,
            });
        };
        let lease =
            self.commit_operator_write(tx, &row, AuditKind::ReleaseQuarantine, machine, operator, now_unix_ms).await?;
        Ok(LiftOutcome::Lifted(lease))
    }

    async fn get(&self, machine: u32) -> Result<Option<LeaseRow>, StoreError> {
        let sql = format!(r#"SELECT {ROW} FROM "{}" WHERE machine_id = ?"#, self.table);
        let row = sqlx::query(&sql).bind(machine).fetch_optional(&self.pool).await.map_err(unavailable)?;
        row.as_ref().map(row_to_lease).transpose()
    }

    async fn list(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let sql = format!(r#"SELECT {ROW} FROM "{}" ORDER BY machine_id"#, self.table);
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await.map_err(unavailable)?;
        rows.iter().map(row_to_lease).collect()
    }

    async fn history(
        &self,
        machine: Option<u32>,
        from_unix_ms: i64,
        to_unix_ms: i64,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let sql = format!(
            r#"SELECT machine_id, event, holder, lease_epoch, lease_expiry, at_unix_ms FROM "{}"
                WHERE (?1 IS NULL OR machine_id = ?1) AND at_unix_ms BETWEEN ?2 AND ?3
                ORDER BY at_unix_ms, seq"#,
            self.audit
        );
        let rows = sqlx::query(&sql)
            .bind(machine)
            .bind(from_unix_ms)
            .bind(to_unix_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                let kind: String = row.try_get("event").map_err(unavailable)?;
                let machine: i64 = row.try_get("machine_id").map_err(unavailable)?;
                let epoch: i64 = row.try_get("lease_epoch").map_err(unavailable)?;
                Ok(AuditEvent {
                    machine_id: machine as u32,
                    kind: AuditKind::parse(&kind)
                        .ok_or_else(|| StoreError::Invalid(format!("audit event {kind:?}")))?,
                    holder: row.try_get("holder").map_err(unavailable)?,
                    lease_epoch: epoch as u64,
                    lease_expiry: row.try_get("lease_expiry").map_err(unavailable)?,
                    at_unix_ms: row.try_get("at_unix_ms").map_err(unavailable)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_fuse_filesystems_are_named_local_ones_are_not() {
        assert_eq!(shared_filesystem(0x6969), Some("NFS"));
        assert_eq!(shared_filesystem(0x6573_5546), Some("FUSE"));
        // statfs' f_type is a signed word on some targets: CIFS' magic comes back sign-extended.
        assert_eq!(shared_filesystem(0xff53_4d42_u32 as i32 as i64 as u64), Some("CIFS"));
        for local in [
            0xef53,      /* ext4 */
            0x5846_5342, /* XFS */
            0x0102_1994, /* tmpfs */
            0x9123_683e, /* btrfs */
        ] {
            assert_eq!(shared_filesystem(local), None, "{local:#x}");
        }
        let dir = tempfile::tempdir().unwrap();
        check_local_filesystem(&dir.path().join("not/yet/leases.db")).unwrap();
    }
}
