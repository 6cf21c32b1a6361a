//! The read cache: stored mappings (opaque and UUIDv7) this instance has created, resolved or
//! looked up, kept in memory both ways (public ID → internal ID for a resolve, internal ID and
//! format → public ID for a lookup), so that a hit answers without the database.
//!
//! A mapping never changes and is never deleted once made, so a cached one is always right and
//! nothing here is ever invalidated. A miss is remembered only for a public ID that can no longer
//! be made (an untagged one once the legacy filter is sealed, or one that carries a valid tag:
//! the database's word on it is final), so that a forged ID that passed the filter costs one
//! read, not one per replay; any other miss is asked again, so a mapping another instance
//! creates a moment later resolves here at once. The
//! cache is bounded by `[cache] max_entries` (quick_cache, which evicts by S3-FIFO: an entry asked
//! for again is kept over one seen once); encrypted public IDs are computed from the key and never
//! cached. Access checks and quotas are the handlers', before the cache is asked.
//!
//! quick_cache rather than moka: on the service's hit path a moka `get` (its concurrent map, read
//! log and frequency sketch) was 7 % of the CPU, and on a create's path moka's inserts and their
//! housekeeping about 40 % (`perf record` under `scripts/bench` stage 7's load); a quick_cache
//! `get` is a shard's read lock and one hash lookup, without housekeeping.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::format::{self, Format};

/// What an entry is found by. A public ID is kept as its 16 bytes with its format (so the
/// upper- and lowercase texts of one UUID are one entry, and an opaque and a UUIDv7 public ID
/// with the same bits are two).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
enum Key {
    Public(Format, [u8; 16]),
    Internal(Format, u64),
}

/// One side of a mapping, with the mapping's type number ([`crate::types`]; `None`: untyped).
#[derive(Debug, Clone)]
enum Value {
    Internal(u64, Option<u16>),
    /// The stored public ID's 16 bytes (its text is made again on a hit: no allocation for
    /// every mapping a create keeps).
    Public([u8; 16], Option<u16>),
    /// A public ID that is not stored and can no longer be made.
    Missing,
}

/// What the cache knows of a public ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// Its mapping: the internal ID and type number.
    Found(u64, Option<u16>),
    /// That it does not exist, and never will.
    Missing,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheOperationLabel {
    operation: &'static str,
}

/// The operations that ask the cache, each series at 0 from the start.
pub const CACHE_OPERATIONS: [&str; 2] = ["resolve", "lookup"];

/// Hits and misses by operation, and how many entries the cache holds (refreshed when
/// `/metrics` is read).
#[derive(Debug, Default)]
struct CacheMetrics {
    hits: Family<CacheOperationLabel, Counter>,
    misses: Family<CacheOperationLabel, Counter>,
    entries: Gauge,
}

/// One operation's hit and miss counters, taken from the families once (a request counts
/// without looking its label up).
#[derive(Debug)]
struct Counted {
    hits: Counter,
    misses: Counter,
}

impl Counted {
    fn of(metrics: &CacheMetrics, operation: &'static str) -> Counted {
        Counted {
            hits: metrics.hits.get_or_create(&CacheOperationLabel { operation }).clone(),
            misses: metrics.misses.get_or_create(&CacheOperationLabel { operation }).clone(),
        }
    }
}

/// The bounded map of stored mappings ([module docs](self)). With `max_entries = 0` it holds
/// nothing and every question is a miss.
pub struct MappingCache {
    entries: Option<quick_cache::sync::Cache<Key, Value>>,
    metrics: CacheMetrics,
    resolves: Counted,
    lookups: Counted,
}

impl std::fmt::Debug for MappingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappingCache {{ entries: {} }}", self.entry_count())
    }
}

impl MappingCache {
    /// A cache of at most `max_entries` entries; a mapping known both ways takes two.
    pub fn new(max_entries: u64) -> Self {
        let capacity = usize::try_from(max_entries).unwrap_or(usize::MAX);
        let entries = (capacity > 0).then(|| quick_cache::sync::Cache::new(capacity));
        let metrics = CacheMetrics::default();
        let [resolve, lookup] = CACHE_OPERATIONS;
        let (resolves, lookups) = (Counted::of(&metrics, resolve), Counted::of(&metrics, lookup));
        MappingCache { entries, metrics, resolves, lookups }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "idgen_public_cache_hits",
            "Resolves and lookups answered from the public-ID service's memory, by operation (resolve, lookup)",
            self.metrics.hits.clone(),
        );
        registry.register(
            "idgen_public_cache_misses",
            "Resolves and lookups of stored public IDs the cache did not hold (asked of the database), by operation",
            self.metrics.misses.clone(),
        );
        registry.register(
            "idgen_public_cache_entries",
            "Entries in the public-ID service's read cache (a mapping known both ways is two)",
            self.metrics.entries.clone(),
        );
    }

    fn get(&self, counted: &Counted, key: Key) -> Option<Value> {
        let found = self.entries.as_ref().and_then(|entries| entries.get(&key));
        let counter = if found.is_some() { &counted.hits } else { &counted.misses };
        counter.inc();
        found
    }

    /// The internal ID and type number of the stored public ID in `format` with these 16
    /// bytes, if cached (counted as a resolve hit or miss).
    pub fn resolve(&self, format: Format, public_id: &[u8; 16]) -> Option<Cached> {
        match self.get(&self.resolves, Key::Public(format, *public_id))? {
            Value::Internal(id, type_number) => Some(Cached::Found(id, type_number)),
            Value::Missing => Some(Cached::Missing),
            Value::Public(..) => None,
        }
    }

    /// The stored public ID (its text, without a type's prefix) and type number of
    /// `internal_id` in `format`, if cached (counted as a lookup hit or miss).
    pub fn lookup(&self, internal_id: u64, format: Format) -> Option<(String, Option<u16>)> {
        match self.get(&self.lookups, Key::Internal(format, internal_id))? {
            Value::Public(bytes, type_number) => Some((format::stored_text(format, &bytes), type_number)),
            Value::Internal(..) | Value::Missing => None,
        }
    }

    /// Keeps a mapping that exists in the database, both ways: its stored text (without a
    /// type's prefix) and type number. Only ever called with one that was found or created: the
    /// cache never holds a mapping the database does not.
    pub fn remember(&self, internal_id: u64, format: Format, public_id: &str, type_number: Option<u16>) {
        if let (Some(entries), Some(bytes)) = (&self.entries, format::stored_bytes(format, public_id)) {
            Self::keep(entries, internal_id, format, bytes, type_number);
        }
    }

    /// [`Self::remember`] a mapping a resolve found by the public ID's 16 bytes (not decoded
    /// again).
    pub fn remember_resolved(&self, internal_id: u64, format: Format, public_id: &[u8; 16], type_number: Option<u16>) {
        if let Some(entries) = &self.entries {
            Self::keep(entries, internal_id, format, *public_id, type_number);
        }
    }

    /// Remembers that the public ID of `format` with these bytes is not stored and can no longer
    /// be made ([module docs](self)): a resolve of it is answered from here from now on.
    pub fn remember_missing(&self, format: Format, public_id: &[u8; 16]) {
        if let Some(entries) = &self.entries {
            entries.insert(Key::Public(format, *public_id), Value::Missing);
        }
    }

    fn keep(
        entries: &quick_cache::sync::Cache<Key, Value>,
        internal_id: u64,
        format: Format,
        bytes: [u8; 16],
        type_number: Option<u16>,
    ) {
        entries.insert(Key::Public(format, bytes), Value::Internal(internal_id, type_number));
        entries.insert(Key::Internal(format, internal_id), Value::Public(bytes, type_number));
    }

    /// The entries held.
    pub fn entry_count(&self) -> u64 {
        self.entries.as_ref().map_or(0, |entries| entries.len() as u64)
    }

    /// Sets `idgen_public_cache_entries` (when `/metrics` is read).
    pub fn refresh_gauge(&self) {
        self.metrics.entries.set(self.entry_count() as i64);
    }
}

#[cfg(test)]
mod tests {
    use idgen::core::uuid;

    use super::*;

    #[test]
    fn both_ways_bounded_and_counted() {
        let cache = MappingCache::new(4);
        let opaque = format::crockford_encode(&[7u8; 16]);
        assert_eq!(cache.resolve(Format::Opaque, &[7u8; 16]), None);
        cache.remember(42, Format::Opaque, &opaque, None);
        assert_eq!(cache.resolve(Format::Opaque, &[7u8; 16]), Some(Cached::Found(42, None)));
        let (public_id, type_number) = cache.lookup(42, Format::Opaque).unwrap();
        assert_eq!((public_id.as_str(), type_number), (opaque.as_str(), None));
        // The same bits in another format are another public ID.
        assert!(cache.lookup(42, Format::Uuidv7).is_none());
        let bytes = uuid::new_v7(1_700_000_000_000, 1, 2);
        cache.remember(43, Format::Uuidv7, &uuid::format(&bytes), Some(3));
        assert_eq!(cache.resolve(Format::Uuidv7, &bytes), Some(Cached::Found(43, Some(3))), "kept with its type");
        // What a resolve found, by its bytes: kept both ways, the lookup's text made from them.
        let found = MappingCache::new(10);
        found.remember_resolved(44, Format::Uuidv7, &bytes, None);
        assert_eq!(found.resolve(Format::Uuidv7, &bytes), Some(Cached::Found(44, None)));
        assert_eq!(found.lookup(44, Format::Uuidv7).map(|(text, _)| text.to_string()), Some(uuid::format(&bytes)));
        for id in 100..200 {
            cache.remember(id, Format::Opaque, &format::crockford_encode(&u128::from(id).to_be_bytes()), None);
        }
        assert!(cache.entry_count() <= 4, "{}", cache.entry_count());
        let hits = cache.metrics.hits.get_or_create(&CacheOperationLabel { operation: "resolve" }).get();
        let misses = cache.metrics.misses.get_or_create(&CacheOperationLabel { operation: "resolve" }).get();
        assert_eq!((hits, misses), (2, 1));
        let off = MappingCache::new(0);
        off.remember(42, Format::Opaque, &opaque, None);
        assert_eq!((off.resolve(Format::Opaque, &[7u8; 16]), off.entry_count()), (None, 0));
    }
}
