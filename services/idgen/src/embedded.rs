//! [`EmbeddedGenerator`]: the whole generator as one piece, started from one configuration and
//! held for the life of the process — what a high-volume service links to mint IDs in-process,
//! and exactly what the fleet worker serves over HTTP.
//!
//! Starting it: the region number, the schedule and the home region from the registry (held to
//! the copy on disk, which it saves), the clock's sync state required (unless development mode
//! switches it off), one lease keeper per layout the schedule needs (the next one claimed
//! `preclaim_ms` before its cutover), all supervised in the background: the registry refreshed,
//! a panicked keeper restarted, a retired region stopped. `shutdown()` releases the leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use idgen_core::Generator;
use idgen_core::generator::Refusal;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{Clock, SystemClock};
use crate::config::{GeneratorConfig, Role};
use crate::control::supervisor::{self, StoreOpener, Supervisor};
use crate::issuing::{Health, IdGenerator};
use crate::metrics::GeneratorMetrics;

/// What [`EmbeddedGenerator::start_with`] takes besides the configuration; all optional.
#[derive(Default, Clone)]
pub struct StartOptions {
    /// The process start time that goes into the holder (default: now).
    pub process_start_unix_ms: Option<i64>,
    /// Lease tables of the caller's instead of the configured ones (tests, fault injection).
    pub stores: Option<StoreOpener>,
    /// Another clock than the system's (tests); its sync state is what the generator requires.
    pub clock: Option<Arc<dyn Clock>>,
    /// Millisecond waits (a batch at the sequence cap) kept by a timer in the runtime this is
    /// started in rather than by the ticker thread ([`SystemClock::with_waits_on_this_runtime`]):
    /// for a process whose one runtime outlives the generator and is always driven, as the
    /// worker's is (the runtime must have I/O enabled).
    pub waits_on_this_runtime: bool,
}

/// Generators started in this process so far.
static STARTED: AtomicU64 = AtomicU64::new(0);

/// The holder of the `nth` generator started in this process (from 0): the process's own for
/// the first, and `/<n>` after it for the others. Two generators of one process started in the
/// same millisecond (Node worker threads, a pool of interpreters) are then two holders, each
/// keeping its own number, where one holder would have them take each other's row (and the
/// second is refused as a second keeper of the first's holder).
fn nth_holder(holder: String, nth: u64) -> String {
    if nth == 0 { holder } else { format!("{holder}/{nth}") }
}

pub struct EmbeddedGenerator {
    generator: Arc<IdGenerator>,
    holder: String,
    region: String,
    region_number: u32,
    development: bool,
    region_names: Arc<RwLock<HashMap<u32, String>>>,
    kept: Arc<RwLock<Vec<String>>>,
    stop: watch::Sender<bool>,
    supervisor: Option<JoinHandle<anyhow::Result<()>>>,
}

impl EmbeddedGenerator {
    /// Starts the generator, registering its metrics in `metrics` (the names a worker
    /// publishes). Returns once every lease table in force could be opened; the first claim
    /// follows in the background ([`Self::ready`] waits for it).
    pub async fn start(config: &GeneratorConfig, metrics: &mut Registry) -> anyhow::Result<Self> {
        Self::start_with(config, metrics, StartOptions::default()).await
    }

    /// [`Self::start`] with what a server or a test supplies itself ([`StartOptions`]).
    pub async fn start_with(
        config: &GeneratorConfig,
        metrics: &mut Registry,
        options: StartOptions,
    ) -> anyhow::Result<Self> {
        config.validate()?;
        let StartOptions { process_start_unix_ms, stores, clock, waits_on_this_runtime } = options;
        if config.development {
            tracing::warn!(
                region = config.region(),
                registry = config.registry_url.as_deref().unwrap_or("none: the built-in schedule, no horizon"),
                "DEVELOPMENT MODE: settings left out take local defaults; never in production"
            );
        }
        let clock = clock.unwrap_or_else(|| {
            let mut clock = SystemClock::new(config.clock.require_sync, config.clock.max_error_ms)
                .with_cpu_counter(config.clock.cpu_counter);
            if waits_on_this_runtime {
                clock = clock.with_waits_on_this_runtime();
            }
            Arc::new(clock) as Arc<dyn Clock>
        });
        if !config.clock.require_sync {
            tracing::warn!("clock synchronization check is OFF: for development only, never in production");
        }
        let region = config.region().to_owned();
        let (schedule, region_number, home_region, names, held) = match &config.registry_url {
            Some(url) => {
                let snapshot = supervisor::initial_snapshot(config, url).await?;
                let number = snapshot.region_number(&region)?;
                tracing::info!(region, number, horizon = %supervisor::describe_ms(snapshot.horizon_ms), "schedule from the registry");
                let home = snapshot.home_region == region;
                if let Some(configured) = config.home_region
                    && configured != home
                {
                    anyhow::bail!(
                        "refusing to start: home_region = {configured} in the configuration, but the registry's home region is {:?} and this is {region:?}",
                        snapshot.home_region
                    );
                }
                (snapshot.schedule()?, number, home, snapshot.region_names(), Some(snapshot))
            }
            None => (
                config.schedule(),
                config.region_number(),
                config.home_region(),
                HashMap::from([(config.region_number(), region.clone())]),
                None,
            ),
        };
        let core = Generator::new(config.core_config(), schedule, region_number, home_region)?;
        let generator_metrics = Arc::new(GeneratorMetrics::default());
        generator_metrics.register(metrics);
        // Which build runs where: the platform team sees embedders that are behind on a fix.
        let role = match config.role {
            Role::Fleet => "fleet",
            Role::Embedded => "embedded",
        };
        metrics.register(
            "idgen_build",
            "The idgen library version this generator runs, and its role",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION")), ("role", role)]),
        );
        let generator = Arc::new(IdGenerator::new(core, clock, generator_metrics));
        // Every series the schedule's layouts have, at 0, before the first scrape.
        generator.refresh_gauges();
        if generator.checks_cpu_counter() {
            tracing::info!(
                "the clock is kept on the CPU's counter (clocksource tsc): the request path checks the counter"
            );
        }
        let holder = nth_holder(
            crate::holder(config.holder.as_deref(), process_start_unix_ms.unwrap_or_else(crate::system_unix_ms)),
            STARTED.fetch_add(1, Ordering::Relaxed),
        );
        let region_names = Arc::new(RwLock::new(names));
        let mut supervisor =
            Supervisor::new(config.clone(), generator.clone(), holder.clone(), region_names.clone(), held);
        if let Some(stores) = stores {
            supervisor = supervisor.with_stores(stores);
        }
        let kept = supervisor.kept_layouts();
        // Open the lease tables now, so a misconfigured store fails the start, not a tick later;
        // whatever was claimed before the failure is released.
        if let Err(error) = supervisor.step().await {
            supervisor.stop_all().await;
            return Err(error);
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(supervisor.run(stopped));
        Ok(EmbeddedGenerator {
            generator,
            holder,
            region,
            region_number,
            development: config.development,
            region_names,
            kept,
            stop,
            supervisor: Some(task),
        })
    }

    /// One ID; strictly above every ID this generator issued before.
    pub async fn next_id(&self) -> Result<u64, Refusal> {
        // The fast path here too, not only inside `IdGenerator::next_id`: it spares the one ID
        // in most calls the nested future (measured: 1.29–1.34× a clock read with it, 1.35–1.37×
        // without). On a miss it is tried once more in there, once per millisecond.
        if let Some(id) = self.generator.try_next_id() {
            return Ok(id);
        }
        self.generator.next_id().await
    }

    /// `count` strictly increasing IDs.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<u64>, Refusal> {
        self.generator.next_ids(count).await
    }

    /// `count` increasing UUIDv7s.
    pub async fn next_uuids(&self, count: u32) -> Result<Vec<[u8; 16]>, Refusal> {
        self.generator.next_uuids(count).await
    }

    /// Issuing, or refusing and why.
    pub fn health(&self) -> Health {
        self.generator.health()
    }

    /// An ID taken apart under the schedule in force (no call anywhere).
    pub fn decode(&self, id: u64) -> Result<idgen_core::DecodedId, idgen_core::DecodeError> {
        self.generator.with_core(|core| core.schedule().decode(id))
    }

    /// Brings the gauges (lease time left, machine number, clock state) up to date: call it
    /// before encoding the metrics registry the generator was started with.
    pub fn refresh_metrics(&self) {
        self.generator.refresh_gauges();
    }

    /// Waits until the generator issues (its first claim done), or `timeout` passes.
    pub async fn ready(&self, timeout: std::time::Duration) -> Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.health() {
                Health::Issuing { .. } => return Ok(()),
                Health::Refusing { refusal, .. } if tokio::time::Instant::now() >= deadline => return Err(refusal),
                Health::Refusing { .. } => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    /// The request path itself, for a server built on this generator.
    pub fn generator(&self) -> &Arc<IdGenerator> {
        &self.generator
    }

    /// The name in this generator's lease rows.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn region_number(&self) -> u32 {
        self.region_number
    }

    pub fn development(&self) -> bool {
        self.development
    }

    /// Region names by number (retired ones too), refreshed with the registry.
    pub fn region_names(&self) -> &Arc<RwLock<HashMap<u32, String>>> {
        &self.region_names
    }

    /// The layouts whose lease keepers run now.
    pub fn layouts(&self) -> Vec<String> {
        self.kept.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Stops issuing and releases every lease (each keeper writes `last issued + 1`). Audit
    /// records still spooled get one last try of at most 2 s; what is left stays on disk for
    /// the next process using the same spool directory.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let stopped = match self.supervisor.take() {
            Some(task) => task.await.context("the lease supervisor task")?,
            None => Ok(()),
        };
        #[cfg(feature = "dynamodb")]
        {
            let left = crate::lease::audit_spool::flush_all(std::time::Duration::from_secs(2)).await;
            if left > 0 {
                tracing::warn!(waiting = left, "audit records still spooled at exit: the next start writes them");
            }
        }
        stopped
    }
}

impl Drop for EmbeddedGenerator {
    /// Dropped without `shutdown()`: the supervisor still stops its keepers, which release, as
    /// long as the runtime runs.
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
