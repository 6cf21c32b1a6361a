//! The check keys and the legacy filter as the database keeps them ([`crate::check`] says what
//! they are for): made by `init`, a version added by `rotate-check-key`, the filter built and
//! sealed by `seal-legacy`, all three under the role that owns the schema; read by the service at
//! start-up and every [`crate::check::REFRESH`]. The same statements on SQLite and PostgreSQL.

use idgen_server::database::Pool;
use idgen_server::on_pool;
use zeroize::Zeroizing;

use super::PublicIdStore;
use crate::check::{self, CheckKeys, GateState, Legacy, LegacyFilter, StoredCheckKey, StoredFilter};
use crate::format::{self, Format};

impl PublicIdStore {
    /// The pool the check keys and the filter are read from.
    pub fn db(&self) -> &Pool {
        &self.pool
    }
}

/// Rows read per page by [`seal_legacy`].
const PAGE: i64 = 10_000;

pub async fn check_keys(db: &Pool) -> Result<Vec<StoredCheckKey>, sqlx::Error> {
    let sql = "SELECT version, check_key, created_at_ms FROM public_id_check_keys ORDER BY version";
    let rows: Vec<(i64, Vec<u8>, i64)> = on_pool!(db, |pool| sqlx::query_as(sql).fetch_all(pool).await)?;
    Ok(rows
        .into_iter()
        .map(|(version, key, created_at_ms)| StoredCheckKey {
            version: version as u8,
            key: Zeroizing::new(key),
            created_at_ms,
        })
        .collect())
}

/// Adds the next check key version, made now; `None` when all 255 are used.
pub async fn add_check_key(db: &Pool, now_ms: i64) -> anyhow::Result<Option<u8>> {
    let highest = check_keys(db).await?.iter().map(|k| k.version).max().unwrap_or(0);
    let Some(version) = highest.checked_add(1) else { return Ok(None) };
    let key = check::new_key()?;
    let sql = "INSERT INTO public_id_check_keys (version, check_key, created_at_ms) VALUES ($1, $2, $3)";
    on_pool!(db, |pool| {
        sqlx::query(sql).bind(i64::from(version)).bind(&key[..]).bind(now_ms).execute(pool).await.map(|_| ())
    })?;
    Ok(Some(version))
}

/// The stored filter's version (`built_at_ms`, sealed), without its bits; `None` before `init`.
async fn filter_version(db: &Pool) -> Result<Option<(i64, bool)>, sqlx::Error> {
    let sql = "SELECT built_at_ms, sealed FROM public_id_legacy_filter WHERE one = 1";
    on_pool!(db, |pool| sqlx::query_as(sql).fetch_optional(pool).await)
}

/// The legacy filter's row: sealed, filter key, hashes, bits, entries, built at.
type FilterRow = (bool, Vec<u8>, i64, Vec<u8>, i64, i64);

pub async fn legacy_filter(db: &Pool) -> Result<Option<StoredFilter>, sqlx::Error> {
    let sql =
        "SELECT sealed, filter_key, hashes, bits, entries, built_at_ms FROM public_id_legacy_filter WHERE one = 1";
    let row: Option<FilterRow> = on_pool!(db, |pool| sqlx::query_as(sql).fetch_optional(pool).await)?;
    Ok(row.map(|(sealed, filter_key, hashes, bits, entries, built_at_ms)| StoredFilter {
        sealed,
        filter_key: Zeroizing::new(filter_key),
        hashes: hashes as u32,
        bits,
        entries,
        built_at_ms,
    }))
}

async fn store_filter(db: &Pool, filter: &StoredFilter) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO public_id_legacy_filter (one, sealed, filter_key, hashes, bits, entries, built_at_ms) \
               VALUES (1, $1, $2, $3, $4, $5, $6) ON CONFLICT (one) DO UPDATE SET sealed = excluded.sealed, \
               filter_key = excluded.filter_key, hashes = excluded.hashes, bits = excluded.bits, \
               entries = excluded.entries, built_at_ms = excluded.built_at_ms";
    on_pool!(db, |pool| {
        sqlx::query(sql)
            .bind(filter.sealed)
            .bind(&filter.filter_key[..])
            .bind(i64::from(filter.hashes))
            .bind(&filter.bits[..])
            .bind(filter.entries)
            .bind(filter.built_at_ms)
            .execute(pool)
            .await
            .map(|_| ())
    })
}

/// `init`'s part: check key version 1 if there is none, and the legacy filter's row if there is
/// none: sealed and empty for a database `init` made new (no instance of a version before can
/// have made an untagged ID in it), open otherwise (until `seal-legacy`).
pub async fn initialize(db: &Pool, new_database: bool, now_ms: i64) -> anyhow::Result<()> {
    if check_keys(db).await?.is_empty() {
        add_check_key(db, now_ms).await?;
    }
    if filter_version(db).await?.is_none() {
        let filter_key = check::new_key()?;
        let bits = if new_database { LegacyFilter::sized(&filter_key, 0).bits().to_vec() } else { Vec::new() };
        let filter = StoredFilter {
            sealed: new_database,
            filter_key,
            hashes: LegacyFilter::sized(b"", 0).hashes(),
            bits,
            entries: 0,
            built_at_ms: now_ms,
        };
        store_filter(db, &filter).await?;
    }
    Ok(())
}

/// What the check is, as stored: refused (saying what to run) when `init` has not made a key.
pub async fn gate_state(db: &Pool) -> anyhow::Result<GateState> {
    let refused = || {
        idgen::config::Refused(
            "the database has no check keys for public IDs: run `idgen public init --config <this file>` (it \
             applies the migrations and makes check key version 1)"
                .into(),
        )
    };
    let keys = CheckKeys::new(&check_keys(db).await?).ok_or_else(refused)?;
    let stored = legacy_filter(db).await?.ok_or_else(refused)?;
    Ok(GateState { keys, filter_version: (stored.built_at_ms, stored.sealed), legacy: legacy_of(&stored) })
}

fn legacy_of(stored: &StoredFilter) -> Legacy {
    match stored.sealed {
        true => {
            Legacy::Sealed(Box::new(LegacyFilter::from_parts(&stored.filter_key, stored.hashes, stored.bits.clone())))
        }
        false => Legacy::Open,
    }
}

/// `state` brought up to date: the keys re-read, the filter re-read only if it changed.
pub async fn refreshed(db: &Pool, state: &GateState) -> anyhow::Result<GateState> {
    let keys = CheckKeys::new(&check_keys(db).await?).unwrap_or_else(|| state.keys.clone());
    let version = filter_version(db).await?.unwrap_or(state.filter_version);
    let legacy = match version == state.filter_version {
        true => state.legacy.clone(),
        false => match legacy_filter(db).await? {
            Some(stored) => legacy_of(&stored),
            None => state.legacy.clone(),
        },
    };
    Ok(GateState { keys, legacy, filter_version: version })
}

/// What `seal-legacy` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// Opaque mappings read.
    pub read: u64,
    /// Of them, untagged: in the filter.
    pub untagged: u64,
    /// The filter's size.
    pub bytes: u64,
}

/// Builds the filter of every untagged opaque public ID the database holds and seals it: from
/// then on an untagged ID outside it is answered 404 without a read. Run once no instance of the
/// version before check keys runs (they make untagged IDs).
pub async fn seal_legacy(db: &Pool, now_ms: i64) -> anyhow::Result<Sealed> {
    let keys = CheckKeys::new(&check_keys(db).await?)
        .ok_or_else(|| anyhow::anyhow!("no check keys: run `idgen public init` first"))?;
    let (count_sql, page_sql) = match db {
        Pool::Postgres(_) => (
            "SELECT count(*) FROM public_ids_opaque",
            "SELECT internal_id, public_id::TEXT, id_type::BIGINT FROM public_ids_opaque WHERE internal_id > $1 OR $2 \
             ORDER BY internal_id LIMIT $3",
        ),
        Pool::Sqlite(_) => (
            "SELECT count(*) FROM public_ids WHERE format = 'opaque'",
            "SELECT internal_id, public_id, id_type FROM public_ids WHERE format = 'opaque' AND (internal_id > $1 \
             OR $2) ORDER BY internal_id LIMIT $3",
        ),
    };
    let count: i64 = on_pool!(db, |pool| sqlx::query_scalar(count_sql).fetch_one(pool).await)?;
    let filter_key = check::new_key()?;
    let mut filter = LegacyFilter::sized(&filter_key, count as u64);
    let (mut read, mut untagged) = (0u64, 0u64);
    let mut after: Option<i64> = None;
    loop {
        let rows: Vec<(i64, String, Option<i64>)> = on_pool!(db, |pool| {
            sqlx::query_as(page_sql)
                .bind(after.unwrap_or(i64::MIN))
                .bind(after.is_none())
                .bind(PAGE)
                .fetch_all(pool)
                .await
        })?;
        for (_, text, type_number) in &rows {
            let bytes = match db {
                Pool::Postgres(_) => text.parse::<uuid::Uuid>().ok().map(|u| *u.as_bytes()),
                Pool::Sqlite(_) => format::stored_bytes(Format::Opaque, text),
            }
            .ok_or_else(|| anyhow::anyhow!("a stored opaque public ID is not 16 bytes: {text:?}"))?;
            read += 1;
            if !keys.verifies(&bytes, type_number.map(|n| n as u16)) {
                filter.insert(&bytes);
                untagged += 1;
            }
        }
        match rows.last() {
            Some((last, _, _)) if rows.len() as i64 == PAGE => after = Some(*last),
            _ => break,
        }
    }
    let bytes = filter.bits().len() as u64;
    let stored = StoredFilter {
        sealed: true,
        filter_key,
        hashes: filter.hashes(),
        bits: filter.bits().to_vec(),
        entries: untagged as i64,
        built_at_ms: now_ms,
    };
    store_filter(db, &stored).await?;
    Ok(Sealed { read, untagged, bytes })
}
