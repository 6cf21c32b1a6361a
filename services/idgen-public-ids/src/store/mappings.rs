//! The mappings: created in batches, resolved by public ID, looked up by internal ID. PostgreSQL
//! keeps a table per stored format (the public ID a `uuid`, a batch bound as two arrays, one
//! prepared statement each); SQLite keeps the first schema (one table, the public ID as text).
//! The two differ, so each operation matches the pool.
//!
//! Never: changes or deletes a mapping; answers a public ID held twice (it answers an error);
//! surfaces a collision of random public IDs (it draws again).

use std::collections::HashMap;

use idgen_server::database::Pool;
use sqlx::{PgPool, SqlitePool};

use super::replica::ReplicaAnswer;
use super::{CreateError, Mapping, PublicIdStore, ResolveError};
use crate::format::{self, Format, RandomUnavailable};

/// A stored mapping as PostgreSQL's statements answer it: internal ID, public ID, type number.
pub(super) type Row = (i64, uuid::Uuid, Option<i16>);

/// A type number as the database keeps it (a `smallint`; numbers are 1 to 32767, [`crate::types`]).
fn type_column(type_number: Option<u16>) -> Option<i16> {
    type_number.map(|n| i16::try_from(n).expect("type numbers are validated to 1..=32767"))
}

/// A type number as the database answered it: only positive ones are ever written (and checked).
fn type_of(column: Option<i16>) -> Option<u16> {
    column.and_then(|n| u16::try_from(n).ok())
}

/// PostgreSQL's statements on the mappings of one stored format, each prepared once per
/// connection (sqlx keeps them by their text). A batch is bound as two arrays, so a batch of any
/// size is one statement.
pub(super) struct Statements {
    pub(super) resolve: &'static str,
    pub(super) lookup: &'static str,
    /// Inserts what is offered, except a row whose internal ID is mapped already (the primary
    /// key) or whose public ID another row holds (looked up through the index of its last 8
    /// bytes, which is not unique: migration 0003 says why), and answers the rows it inserted.
    /// Two creates drawing the same 128 random bits at the same moment could both pass the
    /// look; a resolve would then find two rows and answer 503, never a wrong internal ID.
    pub(super) insert: &'static str,
    /// The mappings of the internal IDs the insert did not map: asked only when there are any
    /// (an idempotent create, or a collision), so a create of new IDs is one statement. Also
    /// what [`legacy`] compares the old table's rows with.
    pub(super) existing: &'static str,
    /// [`legacy::copy`]'s insert of rows from the old table: as they are, the internal ID's
    /// conflict only skipping a row copied before (by the trigger, or an earlier run).
    pub(super) copy: &'static str,
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

pub(super) fn statements(format: Format) -> &'static Statements {
    match format {
        Format::Uuidv7 => &UUIDV7,
        _ => &OPAQUE,
    }
}

/// A stored public ID's text as the `uuid` PostgreSQL keeps; `None` for text of another shape.
fn as_uuid(format: Format, text: &str) -> Option<uuid::Uuid> {
    format::stored_bytes(format, text).map(uuid::Uuid::from_bytes)
}

impl PublicIdStore {
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

    /// The internal ID and type number of the stored public ID of `format` with these 16 bytes
    /// ([`Self::resolve_for`] a caller of no name).
    pub async fn resolve(
        &self,
        format: Format,
        public_id: &[u8; 16],
    ) -> Result<Option<(u64, Option<u16>)>, ResolveError> {
        self.resolve_for("", format, public_id).await
    }

    /// [`Self::resolve`] for `caller`, whose reads of the primary take its share of the budget.
    pub async fn resolve_for(
        &self,
        caller: &str,
        format: Format,
        public_id: &[u8; 16],
    ) -> Result<Option<(u64, Option<u16>)>, ResolveError> {
        let found: Result<Option<(i64, Option<i16>)>, sqlx::Error> = match &self.pool {
            Pool::Postgres(pool) => {
                let bytes = public_id;
                let public_id = uuid::Uuid::from_bytes(*public_id);
                // The replica first; a miss there (not yet replicated, or not there at all), a
                // failure, or no replica reads the primary within the budget ([`super::budget`]).
                if let Some(replica) = self.replica() {
                    let answer = self.within(resolve_on(&replica.pool, format, public_id)).await;
                    match self.answer_of_replica(replica, answer) {
                        ReplicaAnswer::Found(found) => return Ok(Some((found.0 as u64, type_of(found.1)))),
                        ReplicaAnswer::Failed => {}
                        ReplicaAnswer::Missed if format == Format::Uuidv7 && replica.miss_is_final(bytes) => {
                            self.fallback_outcome("final");
                            return Ok(None);
                        }
                        ReplicaAnswer::Missed => {}
                    }
                }
                let _permit = self.primary_read(caller).await?;
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
    /// in a format ([`Self::lookup_for`] a caller of no name).
    pub async fn lookup(
        &self,
        internal_id: u64,
        format: Format,
    ) -> Result<Option<(String, Option<u16>)>, ResolveError> {
        self.lookup_for("", internal_id, format).await
    }

    /// [`Self::lookup`] for `caller`, whose reads of the primary take its share of the budget.
    pub async fn lookup_for(
        &self,
        caller: &str,
        internal_id: u64,
        format: Format,
    ) -> Result<Option<(String, Option<u16>)>, ResolveError> {
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
                let _permit = self.primary_read(caller).await?;
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
        Ok(self.counted("lookup", found)?)
    }

    /// The permits of one read of the primary by `caller` (none without a budget), counted as a
    /// read or a refusal.
    async fn primary_read(&self, caller: &str) -> Result<Option<super::budget::Permit>, ResolveError> {
        let Some(reads) = &self.primary_reads else { return Ok(None) };
        match reads.take(caller).await {
            Some(permit) => {
                self.fallback_outcome("read");
                Ok(Some(permit))
            }
            None => {
                self.fallback_outcome("refused");
                Err(ResolveError::FallbacksBusy)
            }
        }
    }
}

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
