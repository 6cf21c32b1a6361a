//! What `/metrics` shows of the database: whether the probe reached it, failed calls by
//! operation, and the read replica's outcomes and lag. Counted here, never decided here.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
    /// Resolves and lookups asked of the read replica, by what came of it ([`REPLICA_OUTCOMES`]).
    pub replica_reads: Family<ReplicaOutcomeLabel, Counter>,
    /// Resolves the replica missed, by what came of them ([`FALLBACK_OUTCOMES`]).
    pub primary_fallbacks: Family<ReplicaOutcomeLabel, Counter>,
    /// The replica's lag as last measured (ms), -1 when it could not be measured.
    pub replica_lag_ms: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaOutcomeLabel {
    pub outcome: &'static str,
}

/// What a read meant for the replica: `found` there; `missed` there and asked of the primary
/// (replica lag, or an ID that exists nowhere); `failed` there (asked of the primary, and the
/// replica left alone for [`REPLICA_RETRY`](super::REPLICA_RETRY)); `skipped` (asked only of the primary, within that
/// time).
pub const REPLICA_OUTCOMES: [&str; 4] = ["found", "missed", "failed", "skipped"];

/// What became of a resolve or lookup that needed the primary: `read` there, within the budget
/// (`store::budget`); `refused` (503 with `Retry-After`: no read of the budget came free within
/// the acquire timeout); `final` (a UUIDv7 older than the replica's lag bound, with the replica's
/// measured lag within it: the replica's miss is the answer).
pub const FALLBACK_OUTCOMES: [&str; 3] = ["read", "refused", "final"];

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
        for outcome in FALLBACK_OUTCOMES {
            let _ = self.primary_fallbacks.get_or_create(&ReplicaOutcomeLabel { outcome });
        }
        registry.register(
            "idgen_public_primary_fallbacks",
            "Reads of the primary by resolves and lookups (after the replica missed or failed, or with none), by \
             outcome: read (within primary_fallback_reads at once, each caller at most half); refused 503 (none free \
             within the acquire timeout); final (a UUIDv7 older than replica_lag_bound_ms the replica missed, its lag \
             within it: not found without a read)",
            self.primary_fallbacks.clone(),
        );
    }

    /// The replica's series, each at 0 from the start: only with a `read_database_url`.
    pub fn register_replica(&self, registry: &mut Registry) {
        for outcome in REPLICA_OUTCOMES {
            let _ = self.replica_reads.get_or_create(&ReplicaOutcomeLabel { outcome });
        }
        registry.register(
            "idgen_public_replica_reads",
            "Resolves and lookups asked of the read replica, by outcome: found there; missed there and asked of the \
             primary; failed there and asked of the primary; skipped (the replica failed within the last 5 s)",
            self.replica_reads.clone(),
        );
        self.replica_lag_ms.set(-1);
        registry.register(
            "idgen_public_replica_lag_ms",
            "How far the read replica was behind its primary at the last probe (ms); -1 when it could not be \
             measured (then no miss there is final)",
            self.replica_lag_ms.clone(),
        );
    }
}
