//! The lease table in a SQLite file: the embedded default for one host.
//!
//! Each conditional write of SPEC §2 is one SQL statement whose `WHERE` clause is the DynamoDB
//! condition, so it is atomic across every process sharing the file (WAL mode, busy timeout).
//! The audit record is written in the same transaction as the change it records.
//!
//! The tables are created here (`CREATE TABLE IF NOT EXISTS`) rather than by a migration because
//! their names are configuration, exactly as DynamoDB table names are.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::lease_store::{
    AuditEvent, AuditKind, ClaimOutcome, Conditional, LeaseRow, LeaseStore, QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED,
    StoreError,
};

#[derive(Clone)]
pub struct SqliteLeaseStore {
    pool: SqlitePool,
    table: String,
    audit: String,
}

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

impl SqliteLeaseStore {
    /// Opens (creating if needed) the file and the lease and audit tables.
    pub async fn open(path: &Path, table: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(unavailable)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await.map_err(unavailable)?;
        Self::with_pool(pool, table).await
    }

    /// Uses an existing pool (several tables can share one file).
    pub async fn with_pool(pool: SqlitePool, table: &str) -> Result<Self, StoreError> {
        check_table_name(table)?;
        let audit = format!("{table}-audit");
        let store = SqliteLeaseStore { pool, table: table.to_owned(), audit };
        store.create_tables().await?;
        Ok(store)
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
               CREATE INDEX IF NOT EXISTS "{audit}-by-time" ON "{audit}" (at_unix_ms);"#
        );
        sqlx::raw_sql(&ddl).execute(&self.pool).await.map_err(unavailable)?;
        Ok(())
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

fn row_to_lease(row: &sqlx::sqlite::SqliteRow) -> Result<LeaseRow, StoreError> {
    let machine: i64 = row.try_get("machine_id").map_err(unavailable)?;
    let epoch: i64 = row.try_get("lease_epoch").map_err(unavailable)?;
    Ok(LeaseRow {
        machine_id: u32::try_from(machine).map_err(|_| StoreError::Invalid(format!("machine_id {machine}")))?,
        holder: row.try_get("holder").map_err(unavailable)?,
        lease_expiry: row.try_get("lease_expiry").map_err(unavailable)?,
        lease_epoch: u64::try_from(epoch).map_err(|_| StoreError::Invalid(format!("lease_epoch {epoch}")))?,
    })
}

#[async_trait]
impl LeaseStore for SqliteLeaseStore {
    fn describe(&self) -> String {
        format!("sqlite table {}", self.table)
    }

    async fn claim(
        &self,
        machine: u32,
        holder: &str,
        now_unix_ms: i64,
        expiry_unix_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let t = &self.table;
        let sql = format!(
            r#"INSERT INTO "{t}" (machine_id, holder, lease_expiry, lease_epoch) VALUES (?1, ?2, ?3, 1)
               ON CONFLICT (machine_id) DO UPDATE
                  SET holder = excluded.holder,
                      lease_expiry = excluded.lease_expiry,
                      lease_epoch = "{t}".lease_epoch + 1
                WHERE "{t}".lease_expiry < ?4
               RETURNING machine_id, holder, lease_expiry, lease_epoch"#
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(machine)
            .bind(holder)
            .bind(expiry_unix_ms)
            .bind(now_unix_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let Some(row) = row else {
            return Ok(ClaimOutcome::Taken);
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
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let sql = format!(
            r#"UPDATE "{}" SET lease_expiry = ?1
                WHERE machine_id = ?2 AND holder = ?3 AND lease_epoch = ?4 AND lease_expiry < ?1"#,
            self.table
        );
        let done = sqlx::query(&sql)
            .bind(new_expiry_unix_ms)
            .bind(machine)
            .bind(holder)
            .bind(epoch as i64)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        if done.rows_affected() == 1 {
            return Ok(Conditional::Applied);
        }
        let current = self.get(machine).await?;
        if current.is_some_and(|row| row.is_ours(holder, new_expiry_unix_ms, Some(epoch))) {
            return Ok(Conditional::Applied);
        }
        let event = AuditEvent::new(AuditKind::RenewFailed, machine, holder, epoch, new_expiry_unix_ms, now_unix_ms);
        self.audit(&self.pool, &event).await?;
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
        let sql = format!(
            r#"INSERT INTO "{t}" (machine_id, holder, lease_expiry, lease_epoch) VALUES (?1, ?2, ?3, 1)
               ON CONFLICT (machine_id) DO UPDATE
                  SET holder = excluded.holder,
                      lease_expiry = excluded.lease_expiry,
                      lease_epoch = "{t}".lease_epoch + 1
               RETURNING machine_id, holder, lease_expiry, lease_epoch"#
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(machine)
            .bind(QUARANTINED)
            .bind(QUARANTINE_EXPIRY_UNIX_MS)
            .fetch_one(&mut *tx)
            .await
            .map_err(unavailable)?;
        let lease = row_to_lease(&row)?;
        let event = AuditEvent::new(
            AuditKind::Quarantine,
            machine,
            operator,
            lease.lease_epoch,
            lease.lease_expiry,
            now_unix_ms,
        );
        self.commit_audited(tx, &event).await?;
        Ok(lease)
    }

    async fn release_quarantine(
        &self,
        machine: u32,
        operator: &str,
        expiry_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let sql = format!(
            r#"UPDATE "{}" SET holder = ?1, lease_expiry = ?2, lease_epoch = lease_epoch + 1
                WHERE machine_id = ?3 AND holder = ?4
               RETURNING lease_epoch"#,
            self.table
        );
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let row = sqlx::query(&sql)
            .bind(format!("released-by:{operator}"))
            .bind(expiry_unix_ms)
            .bind(machine)
            .bind(QUARANTINED)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
        let Some(row) = row else {
            return Ok(Conditional::ConditionFailed);
        };
        let epoch: i64 = row.try_get("lease_epoch").map_err(unavailable)?;
        let event =
            AuditEvent::new(AuditKind::ReleaseQuarantine, machine, operator, epoch as u64, expiry_unix_ms, now_unix_ms);
        self.commit_audited(tx, &event).await?;
        Ok(Conditional::Applied)
    }

    async fn get(&self, machine: u32) -> Result<Option<LeaseRow>, StoreError> {
        let sql = format!(
            r#"SELECT machine_id, holder, lease_expiry, lease_epoch FROM "{}" WHERE machine_id = ?"#,
            self.table
        );
        let row = sqlx::query(&sql).bind(machine).fetch_optional(&self.pool).await.map_err(unavailable)?;
        row.as_ref().map(row_to_lease).transpose()
    }

    async fn list(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let sql = format!(
            r#"SELECT machine_id, holder, lease_expiry, lease_epoch FROM "{}" ORDER BY machine_id"#,
            self.table
        );
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
