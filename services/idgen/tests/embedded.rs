//! The embedded generator through its public API only: one configuration in, IDs out, under
//! every rule a fleet worker keeps. The faults the worker is tested against end to end (a freeze
//! past the lease, the lease table down, a quarantine, a cutover without a pause) are repeated
//! here against [`EmbeddedGenerator`] itself, on a real SQLite lease file and the system clock.
//! Every ID issued in a test is collected and checked for repeats.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idgen::config::MachineRangeSection;
use idgen::control::supervisor::StoreOpener;
use idgen::core::generator::Refusal;
use idgen::lease::conformance::{Faults, FaultyStore};
use idgen::{
    EmbeddedGenerator, GeneratorConfig, Health, LeaseStore, ManualClock, SqliteLeaseStore, StartOptions, SyncStatus,
};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

const DAY: i64 = 86_400_000;

/// Development mode on a lease file in `dir`, with a 3 s lease renewed every second and a 500 ms
/// fence, so that the faults below play out in seconds.
fn config(dir: &Path, holder: &str) -> GeneratorConfig {
    let mut config = GeneratorConfig::development();
    config.lease.create_tables = true;
    config.holder = Some(holder.into());
    config.clock.require_sync = false;
    config.lease.sqlite_path = Some(dir.join("leases.db"));
    config.schedule_cache = Some(dir.join("schedule.json"));
    (config.lease.lease_ms, config.lease.renew_interval_ms, config.lease.fence_ms) = (3_000, 1_000, 500);
    config.lease.max_backoff_ms = 200;
    config
}

/// Under v1 (in force now), only `machine`.
fn only_machine(mut config: GeneratorConfig, machine: u32) -> GeneratorConfig {
    config.lease.machines.insert("v1".into(), MachineRangeSection { first: machine, last: machine });
    config
}

/// The machine field of a v1 ID.
fn v1_machine(id: u64) -> u32 {
    ((id >> 12) & 0x3ff) as u32
}

fn v1_unix_ms(id: u64) -> i64 {
    (id >> 22) as i64 + idgen::core::EPOCH_UNIX_MS
}

fn assert_unique(ids: &[u64]) -> usize {
    let mut seen = HashSet::with_capacity(ids.len());
    for id in ids {
        assert!(seen.insert(*id), "ID {id} issued twice");
    }
    ids.len()
}

async fn start(config: &GeneratorConfig) -> EmbeddedGenerator {
    let generator = EmbeddedGenerator::start(config, &mut Registry::default()).await.unwrap();
    generator.ready(Duration::from_secs(10)).await.unwrap();
    generator
}

fn machine_held(generator: &EmbeddedGenerator) -> Option<u32> {
    match generator.health() {
        Health::Issuing { leases, .. } | Health::Refusing { leases, .. } => leases.first().map(|lease| lease.machine),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_config_in_ids_out_metrics_and_a_release_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "web");
    let mut metrics = Registry::default();
    let generator = EmbeddedGenerator::start(&config, &mut metrics).await.unwrap();
    generator.ready(Duration::from_secs(10)).await.unwrap();
    assert_eq!(generator.layouts(), vec!["v1".to_owned()]);
    assert!(generator.holder().starts_with("web/pid-"), "{}", generator.holder());

    let first = generator.next_id().await.unwrap();
    let batch = generator.next_ids(5_000).await.unwrap();
    let uuids = generator.next_uuids(3).await.unwrap();
    assert!(batch.windows(2).all(|w| w[0] < w[1]) && first < batch[0], "strictly increasing");
    let machine = v1_machine(first);
    assert!(machine >= 64, "embedded generators take 64 and up; 0–63 are the fleet's: {machine}");
    assert!(uuids.windows(2).all(|w| w[0] < w[1]) && uuids.iter().all(|u| u[6] >> 4 == 7), "UUIDv7s, increasing");

    generator.refresh_metrics();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
    let held = format!("idgen_lease_machine_number{{layout=\"v1\"}} {machine}");
    let build = format!("idgen_build_info{{version=\"{}\",role=\"embedded\"}} 1", env!("CARGO_PKG_VERSION"));
    for line in ["idgen_ids_issued_total 5001", "idgen_uuids_issued_total 3", &held, &build] {
        assert!(text.contains(line), "{line} missing from the metrics:\n{text}");
    }
    // The system clock's discipline, read from the kernel: real numbers, not a placeholder.
    let kernel = idgen::kernel_discipline().expect("adjtimex answers on Linux");
    for (name, kernel_value) in [
        ("idgen_clock_offset_seconds", kernel.offset_seconds),
        ("idgen_clock_estimated_error_seconds", kernel.estimated_error_seconds),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        let value: f64 = line[name.len() + 1..].parse().unwrap();
        assert!(value.is_finite() && (value - kernel_value).abs() < 1.0, "{line} against the kernel's {kernel_value}");
    }
    let last = *batch.last().unwrap();
    generator.shutdown().await.unwrap();

    // The release wrote last issued + 1: the next holder of the number starts above, at once.
    let store = SqliteLeaseStore::open(&dir.path().join("leases.db"), "idgen-leases").await.unwrap();
    let row = store.get(machine).await.unwrap().unwrap();
    assert!(row.lease_expiry <= idgen::system_unix_ms(), "released: {row:?}");
    let successor = start(&only_machine(config, machine)).await;
    let next = successor.next_id().await.unwrap();
    assert_eq!(v1_machine(next), machine);
    assert!(next > last, "the successor continues above the released number's last ID");
    successor.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsynchronized_clock_is_refused_until_it_is_synchronized() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), "clock");
    config.clock.require_sync = true;
    let clock = Arc::new(ManualClock::new(idgen::system_unix_ms()));
    clock.set_sync_status(SyncStatus::Unsynchronized("the kernel reports the clock unsynchronized".into()));
    let options = StartOptions { clock: Some(clock.clone()), ..StartOptions::default() };
    let generator = EmbeddedGenerator::start_with(&config, &mut Registry::default(), options).await.unwrap();
    let refused = generator.ready(Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(refused, Refusal::ClockUnsynchronized { .. }), "{refused:?}");
    assert!(matches!(generator.next_id().await, Err(Refusal::ClockUnsynchronized { .. })));

    clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    generator.ready(Duration::from_secs(10)).await.unwrap();
    generator.next_id().await.unwrap();
    generator.shutdown().await.unwrap();
}

/// An embedding process on a runtime of its own, which the test can freeze: while it sleeps in
/// `Freeze`, nothing of it runs — neither its callers nor its lease keeper, as in a stopped
/// process or a long pause.
struct Process {
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
}

enum Command {
    Issue(u32, oneshot::Sender<Result<Vec<u64>, Refusal>>),
    Machine(oneshot::Sender<Option<u32>>),
    Freeze(Duration),
    Stop,
}

impl Process {
    fn start(config: GeneratorConfig) -> Process {
        let (commands, mut received) = mpsc::unbounded_channel();
        let (ready, started) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let generator = EmbeddedGenerator::start(&config, &mut Registry::default()).await.unwrap();
                generator.ready(Duration::from_secs(10)).await.unwrap();
                ready.send(()).unwrap();
                while let Some(command) = received.recv().await {
                    match command {
                        Command::Issue(count, reply) => {
                            let _ = reply.send(generator.next_ids(count).await);
                        }
                        Command::Machine(reply) => {
                            let _ = reply.send(machine_held(&generator));
                        }
                        Command::Freeze(pause) => std::thread::sleep(pause),
                        Command::Stop => break,
                    }
                }
                generator.shutdown().await.unwrap();
            });
        });
        started.recv_timeout(Duration::from_secs(15)).expect("the process never became ready");
        Process { commands, thread: Some(thread) }
    }

    fn issue(&self, count: u32) -> oneshot::Receiver<Result<Vec<u64>, Refusal>> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Issue(count, reply)).unwrap();
        answer
    }

    async fn machine(&self) -> Option<u32> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Machine(reply)).unwrap();
        answer.await.unwrap()
    }

    fn stop(mut self) {
        self.commands.send(Command::Stop).unwrap();
        self.thread.take().unwrap().join().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_frozen_past_its_lease_refuses_on_waking_and_never_reissues_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = Process::start(only_machine(config(dir.path(), "frozen"), 70));
    let mut before = Vec::new();
    for _ in 0..20 {
        before.extend(frozen.issue(500).await.unwrap().unwrap());
    }
    assert!(before.iter().all(|id| v1_machine(*id) == 70));

    // Frozen until its lease is over and a successor, restricted to the same number, holds it.
    frozen.commands.send(Command::Freeze(Duration::from_secs(6))).unwrap();
    let frozen_at = Instant::now();
    let queued: Vec<_> = (0..16).map(|i| frozen.issue(if i % 2 == 0 { 1 } else { 50 })).collect();
    let successor = start(&only_machine(config(dir.path(), "successor"), 70)).await;
    assert!(frozen_at.elapsed() < Duration::from_secs(6), "the successor claimed while the first was frozen");
    let mut taken_over = Vec::new();
    for _ in 0..20 {
        taken_over.extend(successor.next_ids(500).await.unwrap());
    }

    // On waking, every queued call refuses: the fence has passed on the frozen process's clock.
    for answer in queued {
        match answer.await.unwrap() {
            Err(Refusal::PastFence { machine: 70, .. } | Refusal::NoLease { .. }) => {}
            other => panic!("the woken process answered {other:?}"),
        }
    }
    // Its next renewal fails against the successor's row: it gives the number up.
    let deadline = Instant::now() + Duration::from_secs(5);
    while frozen.machine().await.is_some() {
        assert!(Instant::now() < deadline, "the woken process kept the number");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The successor leaves; the woken process claims 70 again and continues above it.
    let last_successor = *taken_over.last().unwrap();
    successor.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        match frozen.issue(500).await.unwrap() {
            Ok(ids) => break ids,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(refusal) => panic!("never claimed 70 again: {refusal}"),
        }
    };
    assert!(after[0] > last_successor, "above the successor's last ID");
    let last_frozen_ms = before.iter().map(|id| v1_unix_ms(*id)).max().unwrap();
    let first_successor_ms = taken_over.iter().map(|id| v1_unix_ms(*id)).min().unwrap();
    assert!(last_frozen_ms < first_successor_ms, "two holders of 70 never share a millisecond");
    frozen.stop();
    let checked = assert_unique(&[before, taken_over, after].concat());
    println!("freeze: 16 of 16 queued calls refused on waking; {checked} IDs, none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_lease_table_down_it_issues_until_the_fence_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "outage");
    let faults = Arc::new(Faults::default());
    let stores: StoreOpener = {
        let faults = faults.clone();
        Arc::new(move |config: &GeneratorConfig, layout: &str| {
            let (config, layout, faults) = (config.clone(), layout.to_owned(), faults.clone());
            Box::pin(async move {
                let inner = idgen::open_lease_store(&config, &layout).await?;
                Ok(FaultyStore::new(inner, faults) as Arc<dyn LeaseStore>)
            })
        })
    };
    let options = StartOptions { stores: Some(stores), ..StartOptions::default() };
    let generator = EmbeddedGenerator::start_with(&config, &mut Registry::default(), options).await.unwrap();
    generator.ready(Duration::from_secs(10)).await.unwrap();
    let machine = machine_held(&generator).unwrap();
    let mut ids = generator.next_ids(100).await.unwrap();

    faults.set_down(true);
    let down_at = Instant::now();
    let (mut served_while_down, mut first_refusal) = (0, None);
    while down_at.elapsed() < Duration::from_secs(4) {
        match generator.next_ids(10).await {
            Ok(batch) => {
                assert!(first_refusal.is_none(), "issued again inside the fence while the table is down");
                served_while_down += batch.len();
                ids.extend(batch);
            }
            Err(refusal) => {
                assert!(matches!(refusal, Refusal::PastFence { .. }), "{refusal:?}");
                first_refusal.get_or_insert(down_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_refusal = first_refusal.expect("inside the fence it must refuse");
    assert!(served_while_down > 0, "it keeps issuing until the fence");
    // The fence is lease (3 s) − fence (0.5 s) after the last renewal, at most 1 s before the outage.
    assert!(
        first_refusal >= Duration::from_millis(1_400) && first_refusal <= Duration::from_millis(2_700),
        "{first_refusal:?}"
    );
    faults.set_down(false);
    generator.ready(Duration::from_secs(10)).await.unwrap();
    ids.extend(generator.next_ids(1_000).await.unwrap());
    println!(
        "table down: {served_while_down} IDs until the fence at {first_refusal:?}; back on machine {:?} (was {machine})",
        machine_held(&generator)
    );
    generator.shutdown().await.unwrap();
    assert_unique(&ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_takes_the_number_and_it_moves_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let generator = start(&config(dir.path(), "live")).await;
    let machine = machine_held(&generator).unwrap();
    let mut ids = generator.next_ids(500).await.unwrap();

    let store = SqliteLeaseStore::open(&dir.path().join("leases.db"), "idgen-leases").await.unwrap();
    store.quarantine(machine, "oncall", idgen::system_unix_ms()).await.unwrap();
    let quarantined_at = idgen::system_unix_ms();
    let deadline = Instant::now() + Duration::from_secs(10);
    let moved_to = loop {
        if let Ok(batch) = generator.next_ids(100).await {
            let now_on = v1_machine(*batch.last().unwrap());
            ids.extend(batch);
            if now_on != machine {
                break now_on;
            }
        }
        assert!(Instant::now() < deadline, "never moved off the quarantined number");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The renewal that finds the quarantine comes within a renew interval (1 s).
    let late: Vec<_> =
        ids.iter().filter(|id| v1_machine(**id) == machine && v1_unix_ms(**id) > quarantined_at + 1_500).collect();
    assert!(late.is_empty(), "issued under the quarantined number after its renewal failed: {late:?}");
    assert_eq!(store.get(machine).await.unwrap().unwrap().holder, idgen::QUARANTINED);
    ids.extend(generator.next_ids(1_000).await.unwrap());
    generator.shutdown().await.unwrap();
    let checked = assert_unique(&ids);
    println!("quarantine: moved from {machine} to {moved_to}; {checked} IDs, none twice");
}

/// A stand-in registry: home region `eu-west-1` (number 1), v2 from `v2_from_unix_ms`.
async fn registry(v2_from_unix_ms: i64) -> String {
    let since_epoch = |unix: i64| (unix - idgen::core::EPOCH_UNIX_MS) as u64;
    let now = idgen::system_unix_ms();
    let layouts = serde_json::json!({
        "layouts": [
            {"name": "v1", "region_bits": 0, "machine_bits": 10, "sequence_bits": 12, "from_ms": 0},
            {"name": "v2", "region_bits": 3, "machine_bits": 9, "sequence_bits": 10, "from_ms": since_epoch(v2_from_unix_ms)},
        ],
        "horizon_ms": since_epoch(now + 30 * DAY),
        "home_region": "eu-west-1",
    });
    let regions = serde_json::json!({"regions": [
        {"name": "us-east-1", "number": 0, "status": "active"},
        {"name": "eu-west-1", "number": 1, "status": "active"},
    ]});
    let app = axum::Router::new()
        .route("/v1/layouts", axum::routing::get(move || async move { axum::Json(layouts) }))
        .route("/v1/regions", axum::routing::get(move || async move { axum::Json(regions) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutover_passes_without_a_refusal_on_a_number_claimed_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let cutover = idgen::system_unix_ms() + 3_000;
    let mut config = config(dir.path(), "cutover");
    config.registry_url = Some(registry(cutover).await);
    config.region = Some("eu-west-1".into());
    config.home_region = Some(true);
    let generator = start(&config).await;
    assert_eq!(generator.region_number(), 1, "the registry's number");
    assert_eq!(generator.layouts(), vec!["v1".to_owned(), "v2".to_owned()], "v2 claimed ahead of its cutover");
    assert!(dir.path().join("schedule.json").exists(), "the registry's answer is kept on disk");

    let mut ids = Vec::new();
    while idgen::system_unix_ms() < cutover + 1_500 {
        let batch =
            generator.next_ids(50).await.unwrap_or_else(|refusal| panic!("refused across the cutover: {refusal}"));
        ids.extend(batch);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "strictly increasing across the cutover");
    // Both layouts keep the timestamp in the top 41 bits; v2 adds the region (3 bits) and
    // machine numbers 64 and up (9 bits).
    let after: Vec<_> = ids.iter().filter(|id| v1_unix_ms(**id) >= cutover).collect();
    assert!(!after.is_empty() && ids.len() > after.len());
    for id in after {
        assert_eq!((*id >> 19) & 0b111, 1, "v2 IDs carry region 1");
        assert!((*id >> 10) & 0x1ff >= 64, "and an embedded machine number");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while generator.layouts() != vec!["v2".to_owned()] {
        assert!(Instant::now() < deadline, "v1's number is released once its time is over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    generator.shutdown().await.unwrap();
    assert_unique(&ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_configuration_missing_a_setting_refuses_to_start() {
    let production = GeneratorConfig { region: Some("eu-west-1".into()), ..GeneratorConfig::default() };
    let error = EmbeddedGenerator::start(&production, &mut Registry::default()).await.err().unwrap();
    let error = format!("{error:#}");
    for named in ["registry_url", "home_region", "schedule_cache", "lease.store", "development = true"] {
        assert!(error.contains(named), "{named} missing from: {error}");
    }
    assert!(!error.contains("tls."), "an embedded generator has no listener: {error}");
}

/// Two generators of one process started in the same millisecond on one lease file (Node
/// worker threads, a pool of interpreters): before, both took one holder name (the host, the
/// PID, the start millisecond and the process's nonce), and the second was refused as a second
/// keeper of the first's holder, or would have taken its row. Each is its own holder now, on a
/// number of its own, and no ID is issued twice; each keeps working after the other stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_generators_of_one_process_started_in_one_millisecond_are_two_holders() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "web");
    let options = StartOptions { process_start_unix_ms: Some(1_700_000_000_000), ..StartOptions::default() };
    let (mut one, mut two) = (Registry::default(), Registry::default());
    let (first, second) = tokio::join!(
        EmbeddedGenerator::start_with(&config, &mut one, options.clone()),
        EmbeddedGenerator::start_with(&config, &mut two, options.clone()),
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    for generator in [&first, &second] {
        generator.ready(Duration::from_secs(10)).await.unwrap();
    }
    assert_ne!(first.holder(), second.holder(), "one holder for two generators");
    assert!(first.holder().starts_with("web/pid-") && second.holder().starts_with("web/pid-"));
    let (a, b) = (machine_held(&first).unwrap(), machine_held(&second).unwrap());
    assert_ne!(a, b, "two generators on one number");

    let mut ids = Vec::new();
    for _ in 0..2_000 {
        ids.push(first.next_id().await.unwrap());
        ids.push(second.next_id().await.unwrap());
    }
    ids.extend(first.next_ids(5_000).await.unwrap());
    ids.extend(second.next_ids(5_000).await.unwrap());
    first.shutdown().await.unwrap();
    ids.extend(second.next_ids(1_000).await.unwrap());
    assert_unique(&ids);
    assert_eq!(machine_held(&second), Some(b), "the other's shutdown left this one's lease alone");
    second.shutdown().await.unwrap();
}
