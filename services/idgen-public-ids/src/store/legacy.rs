//! PostgreSQL databases made before a mapping was kept at 16 bytes: their mappings, in the one
//! table `public_ids` as text, are copied to the tables of each format, online.
//!
//! Migration 0003 makes the new tables and, where `public_ids` holds mappings, keeps it and the
//! new tables in step both ways with triggers (a mapping either version adds is in both), so that
//! instances of the previous version and of this one can serve side by side in a rolling upgrade.
//! [`copy`] (run by `idgen public init`) then copies what was there before, in batches that are
//! each their own short transaction (a read of 10,000 rows by the primary key, an insert of
//! them): nothing locks the table for longer, and a copy cut off is simply run again. It converts
//! the texts here, not in SQL. Until it has finished, a service of this version refuses to start
//! ([`refusal`]). Once no instance of the previous version runs, [`drop_legacy_table`] (`idgen
//! public drop-legacy-table`) checks that every old row has its copy and drops the old table, its
//! triggers and functions.

use sqlx::{PgExecutor, PgPool};

use crate::format::{self, Format};

/// Rows copied per transaction.
pub const BATCH: i64 = 10_000;

/// The formats stored in the old table, with the name it gives each.
const STORED: [Format; 2] = [Format::Opaque, Format::Uuidv7];

pub(super) async fn legacy_exists(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT to_regclass('public_ids_legacy_copy') IS NOT NULL").fetch_one(pool).await
}

/// The old table's mappings of `format` after internal ID `after`, at most `limit`, in order: one
/// page of the primary key, for the copy and for the check before the drop.
async fn old_rows<'c>(
    executor: impl PgExecutor<'c>,
    format: Format,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT internal_id, public_id FROM public_ids WHERE format = $1 AND internal_id > $2 \
         ORDER BY internal_id LIMIT $3",
    )
    .bind(format.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(executor)
    .await
}

/// Why a service must not start yet: the mappings made before are not all copied.
pub(super) async fn refusal(pool: &PgPool, init: &str) -> Result<Option<String>, sqlx::Error> {
    if !legacy_exists(pool).await? {
        return Ok(None);
    }
    let copied: bool = sqlx::query_scalar("SELECT copied FROM public_ids_legacy_copy").fetch_one(pool).await?;
    Ok((!copied).then(|| {
        format!(
            "the mappings made before this version (table public_ids) are not all copied to the tables of each \
             format yet: run `{init}` (it copies them, online, in short batches) before starting this version"
        )
    }))
}

/// How many old mappings of each stored format a copy went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    pub opaque: u64,
    pub uuidv7: u64,
}

/// Copies the old table's mappings to the new ones, `batch` rows a transaction, unless there is
/// no old table or the copy has finished before. `None` when there was nothing to do.
pub async fn copy(pool: &PgPool, batch: i64) -> anyhow::Result<Option<Copied>> {
    if !legacy_exists(pool).await? {
        return Ok(None);
    }
    let copied: bool = sqlx::query_scalar("SELECT copied FROM public_ids_legacy_copy").fetch_one(pool).await?;
    if copied {
        return Ok(None);
    }
    let mut counts = Copied::default();
    for format in STORED {
        let mut after = i64::MIN;
        loop {
            let mut tx = pool.begin().await?;
            // The new tables' trigger is not to write these rows back to the old one.
            sqlx::query("SET LOCAL idgen.copying = 'on'").execute(&mut *tx).await?;
            let rows = old_rows(&mut *tx, format, after, batch).await?;
            let Some(&(last, _)) = rows.last() else { break };
            let mut internal_ids = Vec::with_capacity(rows.len());
            let mut public_ids = Vec::with_capacity(rows.len());
            for (internal_id, text) in &rows {
                let bytes = format::stored_bytes(format, text).ok_or_else(|| {
                    anyhow::anyhow!(
                        "public_ids holds {text:?} as the {} public ID of {internal_id}, which is not one: \
                         the copy stops here, unfinished; correct or remove that row and run init again",
                        format.as_str()
                    )
                })?;
                internal_ids.push(*internal_id);
                public_ids.push(uuid::Uuid::from_bytes(bytes));
            }
            sqlx::query(super::mappings::statements(format).copy)
                .bind(internal_ids)
                .bind(public_ids)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            match format {
                Format::Uuidv7 => counts.uuidv7 += rows.len() as u64,
                _ => counts.opaque += rows.len() as u64,
            }
            after = last;
        }
    }
    sqlx::query("UPDATE public_ids_legacy_copy SET copied = TRUE").execute(pool).await?;
    tracing::info!(opaque = counts.opaque, uuidv7 = counts.uuidv7, "public IDs: the mappings made before are copied");
    Ok(Some(counts))
}

/// What [`drop_legacy_table`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// There was no old table (a database made by this version, or dropped before).
    NothingToDrop,
    /// The old table held this many mappings, every one with its copy; it is gone.
    Dropped { rows: u64 },
}

/// Drops the old table once every row of it has its copy (the same public ID for the same
/// internal ID and format), with the triggers and functions that kept the two in step. Refused
/// before the copy has finished, or if any row lacks its copy (nothing is dropped then). Instances
/// of the previous version still running would fail from then on: run it once they are gone.
pub async fn drop_legacy_table(pool: &PgPool) -> anyhow::Result<Dropped> {
    if !legacy_exists(pool).await? {
        return Ok(Dropped::NothingToDrop);
    }
    if let Some(why) = refusal(pool, "idgen public init").await? {
        anyhow::bail!("not dropping the old mappings table: {why}");
    }
    // Checked in batches, read without a lock: each a primary-key range of the old table and the
    // same internal IDs of the new one, the texts converted here, so no statement runs long enough
    // to hold back vacuum. A row the previous version adds meanwhile is copied by the trigger in
    // its own transaction, so it cannot be missing.
    let (mut rows, mut missing) = (0u64, 0u64);
    for format in STORED {
        let mut after = i64::MIN;
        loop {
            let batch = old_rows(pool, format, after, BATCH).await?;
            let Some(&(last, _)) = batch.last() else { break };
            let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
            let copies: std::collections::HashMap<i64, uuid::Uuid> =
                sqlx::query_as(super::mappings::statements(format).existing)
                    .bind(ids)
                    .fetch_all(pool)
                    .await?
                    .into_iter()
                    .map(|(id, public_id, _type): super::mappings::Row| (id, public_id))
                    .collect();
            for (id, text) in &batch {
                rows += 1;
                let copied = format::stored_bytes(format, text).map(uuid::Uuid::from_bytes);
                if copied.is_none() || copies.get(id) != copied.as_ref() {
                    missing += 1;
                }
            }
            after = last;
        }
    }
    if missing > 0 {
        anyhow::bail!(
            "not dropping the old mappings table: {missing} of its {rows} rows have no copy with the same public ID; \
             nothing was dropped"
        );
    }
    // The new tables first, then the old one: the order a create of this version takes them in
    // (its insert, then the trigger's), so a create running now waits instead of deadlocking.
    // Not for long: a lock not had in 5 s fails the command, to be run again.
    let mut tx = pool.begin().await?;
    for statement in [
        "SET LOCAL lock_timeout = '5s'",
        "LOCK TABLE public_ids_opaque, public_ids_uuidv7, public_ids IN ACCESS EXCLUSIVE MODE",
        "DROP TRIGGER public_ids_opaque_added ON public_ids_opaque",
        "DROP TRIGGER public_ids_uuidv7_added ON public_ids_uuidv7",
        "DROP TABLE public_ids",
        "DROP TABLE public_ids_legacy_copy",
        "DROP FUNCTION public_ids_added()",
        "DROP FUNCTION public_ids_legacy_added()",
        "DROP FUNCTION public_id_opaque_to_uuid(TEXT)",
        "DROP FUNCTION public_id_uuid_to_opaque(UUID)",
    ] {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Dropped::Dropped { rows })
}
