//! Keeps the generator's schedule and leases in step with time and the registry.
//!
//! Once a second it works out which layouts the generator may need — the one in force now, and
//! the next one from `preclaim_ms` before its cutover, so that at the cutover the generator
//! switches without a pause — and runs one [`LeaseKeeper`] per such layout, each on that layout's
//! lease table. A layout whose time is over has its keeper stopped, which releases its number.
//! Layouts without a region field are skipped outside the home region. Every
//! `registry_refresh_ms` it fetches the registry; a good answer replaces the schedule and the disk
//! copy, a failure changes nothing (the horizon will make the generator refuse if it lasts).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;

use idgen_core::Timestamp;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::GeneratorConfig;
use crate::lease::{Genesis, GenesisHow, GenesisRequest, TableCheck};
use crate::{IdGenerator, LeaseKeeper, LeaseStore, RegistrySnapshot, StoreError};

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), StoreError>>,
}

/// Opens a layout's lease table. A generator opens what its configuration names
/// ([`crate::config::open_lease_store`]); a test can hand in another.
pub type StoreOpener = Arc<
    dyn Fn(&GeneratorConfig, &str) -> Pin<Box<dyn Future<Output = anyhow::Result<Arc<dyn LeaseStore>>> + Send>>
        + Send
        + Sync,
>;

fn configured_stores() -> StoreOpener {
    Arc::new(|config: &GeneratorConfig, layout: &str| {
        let (config, layout) = (config.clone(), layout.to_owned());
        Box::pin(async move { crate::config::open_lease_store(&config, &layout).await })
    })
}

/// The registry's word on a lease table, from the answer the supervisor holds (refreshed):
/// what a keeper asks before every sweep of claims.
struct RegistryTables {
    region: String,
    held: Arc<RwLock<Option<RegistrySnapshot>>>,
    /// A development generator claims in a table whose identity the registry has not recorded.
    development: bool,
}

impl TableCheck for RegistryTables {
    fn check(&self, layout: &str, table: &str, genesis: &Genesis) -> Result<(), String> {
        match &*self.held.read().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            Some(snapshot) => snapshot.check_lease_table(&self.region, layout, table, Some(genesis), self.development),
            None => Ok(()),
        }
    }

    fn still_named(&self, layout: &str, table: &str) -> Result<(), String> {
        match &*self.held.read().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            Some(snapshot) => snapshot.check_lease_table(&self.region, layout, table, None, true),
            None => Ok(()),
        }
    }
}

pub struct Supervisor {
    config: GeneratorConfig,
    generator: Arc<IdGenerator>,
    holder: String,
    region_names: Arc<RwLock<HashMap<u32, String>>>,
    stores: StoreOpener,
    /// The client for the registry (its TLS settings from `registry_tls`).
    registry_http: reqwest::Client,
    keepers: HashMap<String, Running>,
    next_refresh: tokio::time::Instant,
    /// The registry's answer in force; a refresh must be able to replace it.
    held: Option<RegistrySnapshot>,
    /// The same, for the keepers' checks of their tables ([`RegistryTables`]).
    shared_held: Arc<RwLock<Option<RegistrySnapshot>>>,
    /// When a keeper for a layout not yet in force last failed to start (for the log).
    early_failures: HashMap<String, tokio::time::Instant>,
    /// Per layout, how often its keeper ended by itself and when it may be started again.
    restarts: HashMap<String, (u32, tokio::time::Instant)>,
    /// The layouts whose keepers run, as of the last step, for whoever holds the generator.
    kept: Arc<RwLock<Vec<String>>>,
}

impl Supervisor {
    pub fn new(
        config: GeneratorConfig,
        generator: Arc<IdGenerator>,
        holder: String,
        region_names: Arc<RwLock<HashMap<u32, String>>>,
        held: Option<RegistrySnapshot>,
    ) -> Self {
        let next_refresh = tokio::time::Instant::now() + Duration::from_millis(config.registry_refresh_ms);
        // Checked when the generator started (the first registry answer used the same client).
        let registry_http = registry_http(&config).unwrap_or_default();
        let supervisor = Supervisor {
            config,
            generator,
            holder,
            region_names,
            stores: configured_stores(),
            registry_http,
            keepers: HashMap::new(),
            next_refresh,
            shared_held: Arc::new(RwLock::new(held.clone())),
            held,
            early_failures: HashMap::new(),
            restarts: HashMap::new(),
            kept: Arc::default(),
        };
        // A retirement the registry (or the copy on disk) already scheduled holds from the start.
        if let Some(held) = &supervisor.held {
            supervisor.follow_region_status(held, supervisor.config.region());
        }
        supervisor
    }

    /// Lease tables opened by `stores` instead of from the configuration.
    pub fn with_stores(mut self, stores: StoreOpener) -> Self {
        self.stores = stores;
        self
    }

    /// Which layouts need a lease at `now_unix_ms`.
    pub fn needed_layouts(&self, now_unix_ms: i64) -> Vec<String> {
        let home = self.generator.with_core(|core| core.home_region());
        let schedule = self.generator.with_core(|core| core.schedule().clone());
        let entries = schedule.entries();
        let since_epoch = |unix: i64| unix - idgen_core::EPOCH_UNIX_MS;
        let now = since_epoch(now_unix_ms);
        let mut needed = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let start = entry.from.millis() as i64;
            let end = entries.get(i + 1).map_or(i64::MAX, |next| next.from.millis() as i64);
            let soon = start <= now.saturating_add(self.config.preclaim_ms);
            let not_over = end > now.saturating_sub(1_000);
            let before_horizon = (start as u64) < schedule.horizon();
            let allowed = entry.layout.region_bits() > 0 || home;
            if soon && not_over && before_horizon && allowed {
                needed.push(entry.layout.name().to_owned());
            }
        }
        needed
    }

    /// Starts and stops keepers as needed. Returns the layouts now kept. A keeper for the layout
    /// in force that cannot be started is an error, returned after the keepers whose time is over
    /// have been stopped. One for the next layout (claimed early, before its cutover) is logged
    /// and retried: it is not needed yet, and the generator must not refuse to start over it.
    pub async fn step(&mut self) -> anyhow::Result<Vec<String>> {
        if let Some(url) = self.config.registry_url.clone()
            && tokio::time::Instant::now() >= self.next_refresh
        {
            self.next_refresh = tokio::time::Instant::now() + Duration::from_millis(self.config.registry_refresh_ms);
            self.refresh(&url).await;
        }
        let now = self.generator.clock().unix_ms();
        let needed = self.needed_layouts(now);
        let in_force = self.generator.with_core(|core| {
            let since_epoch = u64::try_from(now - idgen_core::EPOCH_UNIX_MS).unwrap_or(0);
            Timestamp::from_millis(since_epoch).map(|t| core.schedule().entry_at(t).layout.name().to_owned())
        });
        // A keeper whose task ended while it was still needed (it panicked) is started again, after
        // a backoff that doubles with each restart (250 ms up to a minute). The new keeper renews
        // the lease the generator still holds, so a keeper that keeps failing takes no numbers.
        let ended: Vec<String> =
            self.keepers.iter().filter(|(_, running)| running.task.is_finished()).map(|(l, _)| l.clone()).collect();
        for layout in ended {
            if let Some(running) = self.keepers.remove(&layout) {
                let restarts = self.restarts.get(&layout).map_or(0, |(count, _)| *count) + 1;
                let delay = Duration::from_millis((125u64 << restarts.min(9)).min(60_000));
                self.restarts.insert(layout.clone(), (restarts, tokio::time::Instant::now() + delay));
                match running.task.await {
                    Err(error) if error.is_panic() => {
                        tracing::error!(%error, layout, restarts, ?delay, "the lease keeper panicked: starting a new one")
                    }
                    outcome => tracing::error!(
                        ?outcome,
                        layout,
                        restarts,
                        ?delay,
                        "the lease keeper stopped by itself: starting a new one"
                    ),
                }
                self.generator.metrics().lease_event(&layout, "keeper_restarted");
            }
        }
        let mut failed = None;
        for layout in &needed {
            let backing_off = self.restarts.get(layout).is_some_and(|(_, at)| tokio::time::Instant::now() < *at);
            if self.keepers.contains_key(layout) || backing_off {
                continue;
            }
            let Err(error) = self.start_keeper(layout).await else {
                self.early_failures.remove(layout);
                continue;
            };
            let error = error.context(format!("starting the lease keeper for layout {layout}"));
            if in_force.as_deref() == Some(layout.as_str()) {
                failed.get_or_insert(error);
            } else if self.early_failures.get(layout).is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                self.early_failures.insert(layout.clone(), tokio::time::Instant::now());
                tracing::error!(
                    error = format!("{error:#}"),
                    layout,
                    "cannot claim early for the next layout; retrying (logged once a minute)"
                );
            }
        }
        let finished: Vec<String> = self.keepers.keys().filter(|k| !needed.contains(k)).cloned().collect();
        for layout in finished {
            tracing::info!(%layout, "layout is over: releasing its machine number");
            if let Some(running) = self.keepers.remove(&layout) {
                stop(running, &layout).await;
            }
        }
        *self.kept.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = self.layouts();
        match failed {
            Some(error) => Err(error),
            None => Ok(needed),
        }
    }

    /// Opens the layout's table and starts its keeper, once the table passes what every claim
    /// asks of it: a table that is not this region's is refused here, so a generator does not start
    /// on it, rather than only stay without a lease.
    async fn start_keeper(&mut self, layout: &str) -> anyhow::Result<()> {
        let store = (self.stores)(&self.config, layout).await?;
        let keeper = self.keeper_on(layout, store.clone()).await;
        let keeper = match keeper {
            Ok(keeper) => keeper,
            // Not kept: its file (SQLite) is closed now, not whenever its pool is dropped.
            Err(error) => {
                store.close().await;
                return Err(error);
            }
        };
        let (stop, stop_rx) = watch::channel(false);
        tracing::info!(layout, "starting the lease keeper");
        self.keepers.insert(layout.to_owned(), Running { stop, task: tokio::spawn(keeper.run(stop_rx)) });
        Ok(())
    }

    /// The keeper of `layout` on `store`, once the table passes what every claim asks of it.
    async fn keeper_on(&mut self, layout: &str, store: Arc<dyn LeaseStore>) -> anyhow::Result<LeaseKeeper> {
        let table = store.table_name();
        let region = self.config.region().to_owned();
        let development = self.config.development;
        let held = self.held.clone();
        if let Some(snapshot) = &held {
            snapshot.check_lease_table(&region, layout, &table, None, development).map_err(anyhow::Error::msg)?;
        }
        // Development's `create_tables`: the generator runs `idgen leases init` itself.
        if self.config.lease.create_tables {
            let request = GenesisRequest {
                how: GenesisHow::Init,
                by: format!("create_tables:{}", self.holder),
                registry_id: held.as_ref().and_then(|snapshot| snapshot.registry_id.clone()),
            };
            match store.record_genesis(&request, self.generator.clock().unix_ms()).await {
                Ok(_) => {}
                Err(error @ StoreError::Unavailable(_)) => {
                    tracing::warn!(%error, table, "could not write the table's genesis (create_tables): asked again before claiming")
                }
                Err(error) => return Err(anyhow::Error::new(error).context(store.describe())),
            }
        }
        match store.check_claimable().await {
            Ok(genesis) => {
                if let Some(snapshot) = &held {
                    snapshot
                        .check_lease_table(&region, layout, &table, Some(&genesis), development)
                        .map_err(anyhow::Error::msg)?;
                }
            }
            Err(error @ StoreError::Unavailable(_)) => {
                tracing::warn!(%error, table, "lease table unreachable at start-up: claiming once it answers")
            }
            Err(error) => return Err(anyhow::Error::new(error).context(store.describe())),
        }
        let mut keeper =
            LeaseKeeper::new(layout, store, self.generator.clone(), self.config.lease_config(), self.holder.clone())?;
        if self.config.registry_url.is_some() {
            let held = self.shared_held.clone();
            keeper = keeper.with_table_check(Arc::new(RegistryTables { region, held, development }));
        }
        Ok(keeper)
    }

    /// The layouts whose keepers are running, sorted.
    pub fn layouts(&self) -> Vec<String> {
        let mut layouts: Vec<String> = self.keepers.keys().cloned().collect();
        layouts.sort();
        layouts
    }

    /// [`Self::layouts`] as of the last step, shared: it stays readable once the supervisor
    /// runs as a task of its own.
    pub fn kept_layouts(&self) -> Arc<RwLock<Vec<String>>> {
        self.kept.clone()
    }

    /// Stops every keeper; each releases its number.
    pub async fn stop_all(&mut self) {
        for (layout, running) in std::mem::take(&mut self.keepers) {
            stop(running, &layout).await;
        }
        self.kept.write().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    async fn refresh(&mut self, url: &str) {
        let region = self.config.region().to_owned();
        match RegistrySnapshot::fetch_with(&self.registry_http, url).await {
            Ok(snapshot) => {
                let follows = match &self.held {
                    Some(held) => snapshot.may_replace(held, &region),
                    None => Ok(()),
                };
                let applied =
                    follows.and_then(|()| snapshot.schedule()).map_err(anyhow::Error::from).and_then(|schedule| {
                        self.generator.with_core(|core| core.set_schedule(schedule)).map_err(anyhow::Error::from)
                    });
                match applied {
                    Ok(()) => {
                        self.generator.metrics().registry_answer_refused.set(0);
                        self.follow_region_status(&snapshot, &region);
                        *self.region_names.write().unwrap_or_else(|p| p.into_inner()) = snapshot.region_names();
                        if let Err(error) = snapshot.save(&self.config.schedule_cache_path()) {
                            tracing::warn!(%error, "could not save the registry copy");
                        }
                        *self.shared_held.write().unwrap_or_else(|p| p.into_inner()) = Some(snapshot.clone());
                        self.held = Some(snapshot);
                    }
                    Err(error) => {
                        self.generator.metrics().registry_answer_refused.set(1);
                        tracing::error!(
                            %error,
                            "the registry's answer was refused: issuing on the copy held until its horizon, and \
                             reporting this generator's region number to that registry (runbooks/registry-started-over.md)"
                        );
                        self.report_number_in_use(url).await;
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "registry refresh failed; keeping the copy held"),
        }
    }

    /// Tells a registry whose answer contradicts the copy held (one started over, or restored from
    /// a backup) the region number this generator still issues under, which registry it follows
    /// and until when its copy lets it issue: that registry then hands the number to no region
    /// added before that time (`POST /v1/numbers-in-use`). Best effort, at every refresh.
    async fn report_number_in_use(&self, url: &str) {
        let Some(held) = &self.held else { return };
        let Some(registry_id) = held.registry_id.clone() else { return };
        let body = serde_json::json!({
            "registry_id": registry_id,
            "region": self.config.region(),
            "region_number": self.generator.with_core(|core| core.region()),
            "issues_until_ms": (held.horizon_ms as i64).saturating_add(idgen_core::EPOCH_UNIX_MS),
        });
        let sent =
            self.registry_http.post(format!("{}/v1/numbers-in-use", url.trim_end_matches('/'))).json(&body).send();
        match sent.await {
            Ok(answer) if answer.status().is_success() => {
                let answer: serde_json::Value = answer.json().await.unwrap_or_default();
                tracing::warn!(%answer, "reported this generator's region number to the registry that answered");
            }
            Ok(answer) => {
                tracing::warn!(status = %answer.status(), "the registry did not take the report of our number")
            }
            Err(error) => tracing::warn!(%error, "could not report our region number to the registry"),
        }
    }

    /// A region the registry no longer lists as active under the number this generator issues
    /// with (retired, or retired and added again under a new number) stops issuing at once. One
    /// whose retirement is scheduled issues until that time and not from it: the time is handed
    /// to the core, which holds it whether or not the registry can be reached again before then.
    fn follow_region_status(&self, snapshot: &RegistrySnapshot, region: &str) {
        let issuing_as = self.generator.with_core(|core| core.region());
        let (retired, retires_at) = match snapshot.active_region(region) {
            Ok(entry) if entry.number == issuing_as => (None, entry.retires_at_ms().ok().flatten()),
            Ok(entry) => (
                Some(format!(
                    "region {region} now has number {} in the registry, not {issuing_as}: its old number is \
                     retired; restart to issue under the new one",
                    entry.number
                )),
                None,
            ),
            Err(_) => (
                Some(format!("region {region} (number {issuing_as}) is not active in the registry: it was retired")),
                None,
            ),
        };
        if let Some(reason) = &retired {
            tracing::error!(reason, "no more IDs under this region");
        }
        let cancelled = retired.is_none() && retires_at.is_none();
        let was = self.generator.with_core(|core| {
            let was = core.region_retires_at();
            core.set_region_retired(retired);
            core.set_region_retires_at(retires_at);
            was
        });
        match (was, retires_at) {
            (was, Some(at)) if was != Some(at) => tracing::warn!(
                region,
                retires_at = %idgen_core::format_unix_ms(at),
                "the registry retires this region: it issues until then, and not from then on"
            ),
            (Some(_), None) if cancelled => tracing::info!(region, "the region's retirement was cancelled"),
            _ => {}
        }
    }

    /// Ticks until `shutdown`, then stops every keeper (each releases its number).
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        loop {
            if *shutdown.borrow() {
                break;
            }
            if let Err(error) = self.step().await {
                tracing::error!(%error, "lease supervisor");
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                changed = shutdown.changed() => if changed.is_err() { break },
            }
        }
        self.stop_all().await;
        Ok(())
    }
}

async fn stop(running: Running, layout: &str) {
    let _ = running.stop.send(true);
    match running.task.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, layout, "releasing the lease failed; it expires on its own"),
        Err(error) => tracing::error!(%error, layout, "lease keeper task failed"),
    }
}

/// The HTTP client for the registry: a 5 s timeout, and TLS as `registry_tls` says.
pub fn registry_http(config: &GeneratorConfig) -> anyhow::Result<reqwest::Client> {
    let tls = config.registry_tls.client_config().context("registry_tls")?;
    Ok(crate::control::registry::registry_client(Duration::from_secs(5), tls)?)
}

/// The registry's answer now, or the last good copy on disk when the registry cannot be reached;
/// `true` with a fresh answer.
///
/// A fresh answer must follow the copy on disk as a refresh must follow the schedule held
/// ([`RegistrySnapshot::may_replace`]): a restart is no way around that rule, and neither is an
/// operator's tool. An unreadable copy is not replaced silently: it is the schedule this region's
/// generators were held to, and the forward-only check needs it.
pub async fn registry_answer(config: &GeneratorConfig, url: &str) -> anyhow::Result<(RegistrySnapshot, bool)> {
    let cache = config.schedule_cache_path();
    match RegistrySnapshot::fetch_with(&registry_http(config)?, url).await {
        Ok(snapshot) => {
            if cache.exists() {
                let held = RegistrySnapshot::load(&cache).map_err(|error| {
                    anyhow::anyhow!(
                        "refusing to start: the registry copy on disk is unreadable ({error}). Compare it with \
                         the registry's GET {url}/v1/layouts; if the registry is the one this region has always \
                         followed, delete {path} and start again",
                        path = cache.display()
                    )
                })?;
                snapshot.may_replace(&held, config.region()).map_err(|error| {
                    anyhow::anyhow!(
                        "refusing to start: {error} (registry {url}, copy {path}). If the registry was restored \
                         from a backup, repair it; if it was reset on purpose (development only), delete {path}",
                        path = cache.display()
                    )
                })?;
            }
            Ok((snapshot, true))
        }
        Err(error) => {
            tracing::warn!(%error, cache = %cache.display(), "registry unreachable: using the last good copy");
            let copy = RegistrySnapshot::load(&cache).map_err(|cached| {
                anyhow::anyhow!("the registry is unreachable ({error}) and there is no usable copy ({cached})")
            })?;
            Ok((copy, false))
        }
    }
}

/// The registry's answer at start-up ([`registry_answer`]), saved as the new copy when fresh; a
/// generator that cannot save it cannot start, since the copy is what lets it restart while the
/// registry is down.
pub async fn initial_snapshot(config: &GeneratorConfig, url: &str) -> anyhow::Result<RegistrySnapshot> {
    let (snapshot, fresh) = registry_answer(config, url).await?;
    if fresh {
        snapshot.save(&config.schedule_cache_path()).map_err(|error| {
            anyhow::anyhow!("{error}: the generator needs this copy to restart while the registry is down")
        })?;
    }
    Ok(snapshot)
}

/// Timestamp helper for logs.
pub fn describe_ms(ms_since_epoch: u64) -> String {
    Timestamp::from_millis(ms_since_epoch).map_or_else(|| "never".into(), |t| idgen_core::format_unix_ms(t.unix_ms()))
}
