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
    seal_with(db, &keys, opaque_count(db).await?, now_ms).await
}

/// Every opaque mapping's public ID (16 bytes) and type number, read in pages of [`PAGE`] by
/// internal ID, each handed to `each`.
async fn each_opaque(db: &Pool, mut each: impl FnMut([u8; 16], Option<u16>)) -> anyhow::Result<u64> {
    let page_sql = match db {
        Pool::Postgres(_) => {
            "SELECT internal_id, public_id::TEXT, id_type::BIGINT FROM public_ids_opaque WHERE internal_id > $1 OR $2 \
             ORDER BY internal_id LIMIT $3"
        }
        Pool::Sqlite(_) => {
            "SELECT internal_id, public_id, id_type FROM public_ids WHERE format = 'opaque' AND (internal_id > $1 \
             OR $2) ORDER BY internal_id LIMIT $3"
        }
    };
    let (mut read, mut after) = (0u64, None::<i64>);
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
            each(bytes, type_number.map(|n| n as u16));
        }
        match rows.last() {
            Some((last, _, _)) if rows.len() as i64 == PAGE => after = Some(*last),
            _ => return Ok(read),
        }
    }
}

async fn opaque_count(db: &Pool) -> Result<i64, sqlx::Error> {
    let sql = match db {
        Pool::Postgres(_) => "SELECT count(*) FROM public_ids_opaque",
        Pool::Sqlite(_) => "SELECT count(*) FROM public_ids WHERE format = 'opaque'",
    };
    on_pool!(db, |pool| sqlx::query_scalar(sql).fetch_one(pool).await)
}

/// What `retire-check-key` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetiredKey {
    /// The version is gone; `moved` public IDs made under it went into the sealed legacy filter
    /// (they keep resolving; 0 unless forced), or, with the filter still open, are read as
    /// untagged ones are.
    Retired { moved: u64, filter_sealed: bool },
    /// Refused: `made` public IDs carry its tag, and retiring it would leave them to the legacy
    /// filter (`--force`).
    InUse { made: u64 },
}

/// Retires check key `version`: refused for the newest one (rotate first), for one new IDs may
/// still be made under (until the next is in use on every instance), and, unless `force`, for
/// one under which public IDs were made; forced, those IDs are put into the legacy filter (a
/// sealed one is rebuilt without the version's key), then the version is deleted. Instances drop
/// it at their next reload (30 s). Versions are never reused: the newest always remains.
pub async fn retire_check_key(db: &Pool, version: u8, force: bool, now_ms: i64) -> anyhow::Result<RetiredKey> {
    let stored = check_keys(db).await?;
    anyhow::ensure!(
        stored.iter().any(|k| k.version == version),
        "no check key version {version} (the versions are {:?})",
        stored.iter().map(|k| k.version).collect::<Vec<_>>()
    );
    let newest = stored.iter().map(|k| k.version).max().expect("one at least");
    anyhow::ensure!(
        version != newest,
        "check key version {version} is the newest: run `idgen public rotate-check-key` first, and retire it once \
         the next one is in use"
    );
    // In use for new IDs on every instance: added ROTATION_DELAY ago, and each instance's reload
    // (twice REFRESH, for their clocks and this one's to differ) since.
    let settled = (check::ROTATION_DELAY + 2 * check::REFRESH).as_millis() as i64;
    let successor = stored.iter().filter(|k| k.version > version).map(|k| k.created_at_ms).min().expect("newer");
    anyhow::ensure!(
        successor + settled <= now_ms,
        "new opaque public IDs may still be made under check key version {version}: retire it from {} s from now",
        (successor + settled - now_ms + 999) / 1000
    );
    let keys = CheckKeys::new(&stored).expect("keys");
    let mut made = 0u64;
    each_opaque(db, |bytes, type_number| {
        if bytes[0] == version && keys.verifies(&bytes, type_number) {
            made += 1;
        }
    })
    .await?;
    if made > 0 && !force {
        return Ok(RetiredKey::InUse { made });
    }
    let remaining: Vec<StoredCheckKey> = stored.iter().filter(|k| k.version != version).cloned().collect();
    let filter_sealed = legacy_filter(db).await?.is_some_and(|filter| filter.sealed);
    if made > 0 && filter_sealed {
        let keys = CheckKeys::new(&remaining).expect("the newest remains");
        seal_with(db, &keys, opaque_count(db).await?, now_ms).await?;
    }
    let sql = "DELETE FROM public_id_check_keys WHERE version = $1";
    on_pool!(db, |pool| sqlx::query(sql).bind(i64::from(version)).execute(pool).await.map(|_| ()))?;
    Ok(RetiredKey::Retired { moved: made, filter_sealed })
}

/// Builds and stores a sealed filter of every opaque public ID that `keys` do not verify.
async fn seal_with(db: &Pool, keys: &CheckKeys, count: i64, now_ms: i64) -> anyhow::Result<Sealed> {
    let filter_key = check::new_key()?;
    let mut filter = LegacyFilter::sized(&filter_key, count as u64);
    let mut untagged = 0u64;
    let read = each_opaque(db, |bytes, type_number| {
        if !keys.verifies(&bytes, type_number) {
            filter.insert(&bytes);
            untagged += 1;
        }
    })
    .await?;
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
