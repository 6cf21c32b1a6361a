//! A lease table's genesis: its own record, written once by an explicit step, that it is the table
//! its region's generators claim in.
//!
//! A lease table is the only record of who holds which machine number, so a table that is not the
//! fleet's says less than the truth: a fresh table made beside the live one (by a stack, a script,
//! `idgen leases init` under a new name, DynamoDB's import) shows every number free while the live
//! table's holders issue under them. Nothing about such a table tells it apart from a new region's
//! first table, except who made it the fleet's: no generator claims in a table without a genesis,
//! and only `idgen leases init` (or development's `lease.create_tables`, the same step run by the
//! generator at its start) and `idgen leases adopt` write one. Where a registry is configured the
//! genesis also records the registry's identity, so a registry started over (a new database, an
//! old backup: region numbers from 0 again) is refused by every generator, with a copy of the old
//! registry on disk or without one
//! ([`RegistrySnapshot::check_lease_table`](crate::control::registry::RegistrySnapshot::check_lease_table)).
//!
//! DynamoDB binds the genesis to the table's creation time, as it binds an adoption: a copy of a
//! table (a restore, an import) carries the record but is not the table it was written for.

/// How a table became its fleet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenesisHow {
    /// `idgen leases init` (or `lease.create_tables` in development).
    Init,
    /// `idgen leases adopt`: the table replaces `from` (a table name, or `gone`), whose numbers'
    /// holders were cut off before any claim here could take their numbers.
    Adopted { from: String },
}

impl GenesisHow {
    /// The stored text: `init`, or `adopt`.
    pub fn kind(&self) -> &'static str {
        match self {
            GenesisHow::Init => "init",
            GenesisHow::Adopted { .. } => "adopt",
        }
    }

    pub fn adopted_from(&self) -> Option<&str> {
        match self {
            GenesisHow::Init => None,
            GenesisHow::Adopted { from } => Some(from),
        }
    }

    /// From the stored kind and source.
    pub fn parse(kind: &str, adopted_from: Option<String>) -> Option<Self> {
        match (kind, adopted_from) {
            ("init", _) => Some(GenesisHow::Init),
            ("adopt", Some(from)) => Some(GenesisHow::Adopted { from }),
            _ => None,
        }
    }
}

/// A lease table's genesis record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Genesis {
    /// 128 random bits drawn when it was written: which table this is, in logs and messages.
    pub table_id: String,
    /// The identity of the registry whose region this table belongs to; `None` when it was written
    /// without a registry (development, one host).
    pub registry_id: Option<String>,
    pub how: GenesisHow,
    /// The operator (or `create_tables:<holder>`) who wrote it.
    pub by: String,
    /// When, by the writer's clock (Unix ms).
    pub at_unix_ms: i64,
    /// DynamoDB: the creation time of the table it was written for (a copy carries the record but
    /// not the time). SQLite: none.
    pub table_created_unix_ms: Option<i64>,
}

/// What a writer of a genesis asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenesisRequest {
    pub how: GenesisHow,
    pub by: String,
    /// The registry to bind the table to, where one is configured.
    pub registry_id: Option<String>,
}

/// What [`decide`] says a store should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenesisWrite {
    /// The table already has this genesis; nothing to write.
    Keep(Genesis),
    /// Write this one (over the one read, which must still be there unchanged).
    Put(Genesis),
}

/// The one rule for writing a genesis, for every store. `existing` is the record the table holds;
/// `created` the table's creation time where the store has one.
///
/// - None yet: write it (`init` on a live table of an earlier release records one and changes no
///   row: the upgrade path).
/// - `init` over one of this table: keep it; bind it to the registry if it names none yet. A
///   genesis bound to another registry is refused: the table belongs to that registry's region.
/// - `init` over one written for another table (a copy: a restore or an import) is refused:
///   copies are adopted, never initialized.
/// - `adopt` writes its own (the adoption is what makes a copy its fleet's), keeping the registry
///   the table was bound to, and refusing another.
pub fn decide(
    existing: Option<&Genesis>,
    created: Option<i64>,
    request: &GenesisRequest,
    table: &str,
    now_unix_ms: i64,
) -> Result<GenesisWrite, String> {
    let fresh = |registry_id: Option<String>| Genesis {
        table_id: format!("{:032x}", rand::random::<u128>()),
        registry_id,
        how: request.how.clone(),
        by: request.by.clone(),
        at_unix_ms: now_unix_ms,
        table_created_unix_ms: created,
    };
    let Some(existing) = existing else { return Ok(GenesisWrite::Put(fresh(request.registry_id.clone()))) };
    let registry_id = match (&existing.registry_id, &request.registry_id) {
        (Some(held), Some(asked)) if held != asked => {
            return Err(format!(
                "lease table {table} belongs to the region of registry {held} (its genesis says so), and this \
                 configuration's registry is {asked}: a registry started over (a new database, or one restored \
                 from a backup older than this table) would number regions from 0 again. Point registry_url at \
                 the registry this table was made for"
            ));
        }
        (held, asked) => held.clone().or_else(|| asked.clone()),
    };
    let same_table = existing.table_created_unix_ms == created;
    match &request.how {
        GenesisHow::Init if !same_table => Err(copied(table, existing.table_created_unix_ms)),
        GenesisHow::Init if registry_id == existing.registry_id => Ok(GenesisWrite::Keep(existing.clone())),
        GenesisHow::Init => Ok(GenesisWrite::Put(Genesis { registry_id, ..existing.clone() })),
        GenesisHow::Adopted { .. } => Ok(GenesisWrite::Put(fresh(registry_id))),
    }
}

/// The refusal of a table that holds the genesis of another table, made at `made`: a copy.
pub fn copied(table: &str, made: Option<i64>) -> String {
    format!(
        "lease table {table} holds the genesis of another table (made {}): it is a copy (a restore, an import), \
         whose rows are older than the leases their numbers' holders may hold elsewhere. A copy is adopted, not \
         initialized: `idgen leases adopt` (runbooks/lease-table-restore.md)",
        made.map_or_else(|| "at an unknown time".into(), idgen_core::format_unix_ms)
    )
}

/// The refusal of a table without a genesis, for every store.
pub fn missing(table: &str) -> String {
    format!(
        "lease table {table} has no genesis record: nothing says it is this region's table rather than a fresh \
         one made beside it, whose numbers may be held by generators issuing in another table. Nothing is \
         claimed in it until `idgen leases init --config <this configuration>` records that it is (on a table \
         an earlier release has been using, init only adds the record and changes no row); a table that \
         replaces another is adopted instead (`idgen leases adopt`, runbooks/lease-table-restore.md)"
    )
}

/// The refusal of a SQLite lease file's table without a genesis. The file may be new, or one put
/// in the place of the file generators were using (restored from a copy, removed and made again):
/// the processes that had the old file open hold leases written there, which nobody opening the
/// path sees, until their next renewal finds the file replaced and stops them. `init` is safe only
/// once they have stopped.
pub fn missing_in_file(table: &str, file: &str) -> String {
    format!(
        "lease table {table} in {file} has no genesis record, so nothing says it is the table this host's \
         generators claim in. If {file} is new (a new host, a first start), run `idgen leases init --config <this \
         configuration>`. If it replaced a file generators were using (restored from a copy, removed and made \
         again), those generators still issue under leases written in the old file, which no process opening \
         {file} sees, until their next renewal finds the file replaced and stops them: run init only once every \
         process that had the old file open has stopped (`fuser {file}`; their logs say \"not the one this process \
         opened\"), or the longest lease (one hour) has passed since the file was replaced \
         (runbooks/lease-table-restore.md)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(how: GenesisHow, registry: Option<&str>) -> GenesisRequest {
        GenesisRequest { how, by: "oncall".into(), registry_id: registry.map(str::to_owned) }
    }

    fn put(write: Result<GenesisWrite, String>) -> Genesis {
        match write {
            Ok(GenesisWrite::Put(genesis)) => genesis,
            other => panic!("expected a write: {other:?}"),
        }
    }

    #[test]
    fn init_writes_once_binds_a_registry_once_and_refuses_another_or_a_copy() {
        let first = put(decide(None, Some(7), &request(GenesisHow::Init, None), "t", 100));
        assert_eq!((first.registry_id.as_deref(), first.table_created_unix_ms), (None, Some(7)));
        // Again: nothing to write.
        let again = decide(Some(&first), Some(7), &request(GenesisHow::Init, None), "t", 200);
        assert_eq!(again, Ok(GenesisWrite::Keep(first.clone())));
        // With a registry: bound, the rest kept.
        let bound = put(decide(Some(&first), Some(7), &request(GenesisHow::Init, Some("r1")), "t", 300));
        assert_eq!(bound, Genesis { registry_id: Some("r1".into()), ..first.clone() });
        assert_eq!(
            decide(Some(&bound), Some(7), &request(GenesisHow::Init, Some("r1")), "t", 400),
            Ok(GenesisWrite::Keep(bound.clone()))
        );
        let other = decide(Some(&bound), Some(7), &request(GenesisHow::Init, Some("r2")), "t", 400).unwrap_err();
        assert!(other.contains("registry r1") && other.contains("started over"), "{other}");
        // A copy of the table (another creation time) is never initialized.
        let copy = decide(Some(&first), Some(9), &request(GenesisHow::Init, None), "t", 400).unwrap_err();
        assert!(copy.contains("copy") && copy.contains("idgen leases adopt"), "{copy}");
    }

    #[test]
    fn adopt_writes_its_own_keeping_the_registry_and_refusing_another() {
        let bound = put(decide(None, Some(7), &request(GenesisHow::Init, Some("r1")), "t", 100));
        let from = GenesisHow::Adopted { from: "old".into() };
        let adopted = put(decide(Some(&bound), Some(9), &request(from.clone(), None), "t", 200));
        assert_eq!((adopted.how, adopted.registry_id.as_deref()), (from.clone(), Some("r1")));
        assert_eq!(adopted.table_created_unix_ms, Some(9), "bound to the copy's own creation time");
        assert_ne!(adopted.table_id, bound.table_id);
        assert!(decide(Some(&bound), Some(9), &request(from, Some("r2")), "t", 200).is_err());
        assert_eq!(GenesisHow::parse("adopt", Some("old".into())), Some(GenesisHow::Adopted { from: "old".into() }));
        assert_eq!(GenesisHow::parse("init", None), Some(GenesisHow::Init));
        assert_eq!(GenesisHow::parse("adopt", None), None);
    }
}
