//! The audit: one row appended by every write, in its transaction; read newest first. Written
//! once and compiled for each database's own driver (`super::Db`).
//!
//! Never: updates or deletes a row.

use sqlx::Row;

use super::Db;
use crate::store::{AuditRow, RegistryError};

/// [`RegistryStore::audit_log`](crate::store::RegistryStore::audit_log) on this driver.
pub async fn audit_log(pool: &sqlx::Pool<Db>, limit: i64) -> Result<Vec<AuditRow>, RegistryError> {
    let rows = sqlx::query("SELECT at_ms, actor, action, detail FROM registry_audit ORDER BY seq DESC LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
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

pub(super) async fn audit(
    tx: &mut sqlx::Transaction<'_, Db>,
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
