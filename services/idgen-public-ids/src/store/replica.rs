//! The read replica (a streaming replica, an Aurora reader): asked first by resolves and
//! lookups, its lag measured, and the primary reads of its misses held to a budget of their own.
//!
//! Never: answers "not found" on the replica's word alone, except for a UUIDv7 older than the lag
//! bound while the measured lag is within it; lets its misses take the primary's pool from
//! creates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idgen_server::database::{Pool, PoolSettings, pg_options};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::PublicIdStore;
use super::metrics::ReplicaOutcomeLabel;

/// What a replica's resolve misses may cost the primary ([`PublicIdStore::with_replica`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackSettings {
    /// Reads of the primary by resolves and lookups at once (each caller at most half of them);
    /// more wait, then are refused 503 ([`super::budget`]).
    pub reads: u32,
    /// A UUIDv7 public ID older than this, missed by a replica measured to lag less, is not found
    /// without asking the primary.
    pub lag_bound: Duration,
}

impl Default for FallbackSettings {
    fn default() -> Self {
        FallbackSettings { reads: 4, lag_bound: Duration::from_secs(60) }
    }
}

/// How long reads leave a replica alone after it failed one, so that a replica that is gone costs
/// one timeout, not one per request.
pub const REPLICA_RETRY: Duration = Duration::from_secs(5);

/// A read replica (a streaming replica, an Aurora reader): asked first by resolves and lookups,
/// never trusted with "not found" (a miss there is asked of the primary: replica lag never
/// answers 404 for a mapping that exists), and left alone for [`REPLICA_RETRY`] after it fails.
#[derive(Clone)]
pub(super) struct Replica {
    pub(super) pool: PgPool,
    /// Until when (ms on the process's monotonic clock) reads skip it.
    pub(super) skip_until_ms: Arc<AtomicU64>,
    began: Instant,
    lag_bound_ms: u64,
    /// Its lag at the last probe (ms) and when that was (ms on the monotonic clock above);
    /// `u64::MAX` before the first answer or after one that failed.
    lag: Arc<(AtomicU64, AtomicU64)>,
}

impl Replica {
    fn now_ms(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// Whether a replica's miss of the UUIDv7 `public_id` is the answer: it was made longer than
    /// the lag bound ago, and the replica's lag now (the last measure plus the time since, as it
    /// can grow no faster) is within the bound.
    pub(super) fn miss_is_final(&self, public_id: &[u8; 16]) -> bool {
        let mut made = [0u8; 8];
        made[2..].copy_from_slice(&public_id[..6]);
        let age_ms = (idgen::system_unix_ms().max(0) as u64).saturating_sub(u64::from_be_bytes(made));
        let (lag, at) = (self.lag.0.load(Ordering::Relaxed), self.lag.1.load(Ordering::Relaxed));
        let lag_now = lag.saturating_add(self.now_ms().saturating_sub(at));
        age_ms > self.lag_bound_ms && lag != u64::MAX && lag_now < self.lag_bound_ms
    }
}

/// What the replica answered a read.
pub(super) enum ReplicaAnswer<T> {
    Found(T),
    Missed,
    Failed,
}

/// How far a streaming replica is behind its primary (ms): nothing received but not replayed, the
/// time since the primary's last message; otherwise the time since the last replayed commit. No
/// row when it is not streaming or cannot say (a role without `pg_read_all_stats`, a replica of
/// another kind): then no miss there is final.
const REPLICA_LAG: &str = "SELECT (EXTRACT(EPOCH FROM clock_timestamp() - CASE WHEN pg_last_wal_receive_lsn() = \
     pg_last_wal_replay_lsn() THEN r.last_msg_send_time ELSE pg_last_xact_replay_timestamp() END) * 1000)::BIGINT \
     FROM pg_stat_wal_receiver r WHERE r.status = 'streaming' AND r.last_msg_send_time IS NOT NULL";

impl PublicIdStore {
    /// Resolves and lookups ask the PostgreSQL replica at `url` first ([`Replica`]), through a
    /// pool of the same settings. Connected lazily: a replica that is down at start-up does not
    /// keep the service from starting, its reads go to the primary.
    pub fn with_replica(
        mut self,
        url: &str,
        settings: PoolSettings,
        fallback: FallbackSettings,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            matches!(self.pool, Pool::Postgres(_)),
            "read_database_url: a read replica needs a PostgreSQL database_url"
        );
        let pool = PgPoolOptions::new()
            .max_connections(settings.connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_lazy_with(pg_options(url, settings)?);
        self.primary_reads = Some(super::budget::PrimaryReads::new(fallback.reads, settings.acquire_timeout));
        self.replica = Some(Replica {
            pool,
            skip_until_ms: Arc::default(),
            began: Instant::now(),
            lag_bound_ms: fallback.lag_bound.as_millis() as u64,
            lag: Arc::new((AtomicU64::new(u64::MAX), AtomicU64::new(0))),
        });
        Ok(self)
    }

    /// Measures the replica's lag (`idgen_public_replica_lag_ms`), within `within`; nothing
    /// without a replica.
    pub async fn probe_replica_lag(&self, within: Duration) {
        let Some(replica) = &self.replica else { return };
        let asked = sqlx::query_scalar::<_, i64>(REPLICA_LAG).fetch_optional(&replica.pool);
        let lag = match tokio::time::timeout(within, asked).await {
            Ok(Ok(Some(lag))) => Some(lag.max(0) as u64),
            _ => None,
        };
        replica.lag.1.store(replica.now_ms(), Ordering::Relaxed);
        replica.lag.0.store(lag.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.metrics.replica_lag_ms.set(lag.map_or(-1, |lag| lag as i64));
    }

    pub(super) fn fallback_outcome(&self, outcome: &'static str) {
        self.metrics.primary_fallbacks.get_or_create(&ReplicaOutcomeLabel { outcome }).inc();
    }

    /// The replica, unless there is none or it failed within [`REPLICA_RETRY`] (`skipped`).
    pub(super) fn replica(&self) -> Option<&Replica> {
        let replica = self.replica.as_ref()?;
        if replica.now_ms() < replica.skip_until_ms.load(Ordering::Relaxed) {
            self.replica_outcome("skipped");
            return None;
        }
        Some(replica)
    }

    fn replica_outcome(&self, outcome: &'static str) {
        self.metrics.replica_reads.get_or_create(&ReplicaOutcomeLabel { outcome }).inc();
    }

    /// What the replica answered, if it is to be the answer: found there. A miss or a failure
    /// is `None` (the caller asks the primary); a failure also leaves the replica alone for a
    /// while.
    pub(super) fn answer_of_replica<T>(
        &self,
        replica: &Replica,
        answer: Result<Option<T>, sqlx::Error>,
    ) -> ReplicaAnswer<T> {
        match answer {
            Ok(Some(found)) => {
                self.replica_outcome("found");
                ReplicaAnswer::Found(found)
            }
            Ok(None) => {
                self.replica_outcome("missed");
                ReplicaAnswer::Missed
            }
            Err(error) => {
                tracing::warn!(%error, "public-ID storage: the read replica failed; reading the primary");
                self.replica_outcome("failed");
                replica.skip_until_ms.store(replica.now_ms() + REPLICA_RETRY.as_millis() as u64, Ordering::Relaxed);
                ReplicaAnswer::Failed
            }
        }
    }
}
