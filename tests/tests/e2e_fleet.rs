//! End-to-end: three real worker processes on one SQLite lease table, a million IDs from
//! concurrent clients, and a worker frozen with SIGSTOP past its lease while another takes its
//! machine number over. Every ID of a run is collected and checked for repeats.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use idgen::{LeaseStore, SqliteLeaseStore};
use idgen_e2e::{Issued, WorkerProcess, WorkerSpec, assert_no_duplicates, post_ids, v1_fields};
use rand::{Rng, SeedableRng};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_three_workers_a_million_unique_ids() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let mut workers = Vec::new();
    for name in ["w1", "w2", "w3"] {
        let spec = WorkerSpec {
            lease_ms: 300_000,
            renew_interval_ms: 10_000,
            fence_ms: 5_000,
            ..WorkerSpec::short_lease(name, &db)
        };
        workers.push(WorkerProcess::start(&spec).await.unwrap());
    }
    let client = client();
    let mut machines = Vec::new();
    for worker in &workers {
        machines.push(worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap());
    }
    let distinct: HashSet<_> = machines.iter().collect();
    assert_eq!(distinct.len(), 3, "machine numbers must be distinct: {machines:?}");
    assert!(machines.iter().all(|m| *m <= 63), "fleet range is 0–63: {machines:?}");

    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let target = 1_000_000usize;
    let clients = 8;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|task| {
            let (client, urls) = (client.clone(), urls.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::from_rng(&mut rand::rng());
                // Per worker, this task's IDs in request order: each request starts after the
                // previous answered, so they must strictly increase.
                let mut streams: Vec<Vec<u64>> = vec![Vec::new(); urls.len()];
                let (mut singles, mut batches, mut issued) = (0, 0, 0);
                while issued < target / clients {
                    let worker = rng.random_range(0..urls.len());
                    let count = if rng.random_bool(0.3) { 1 } else { rng.random_range(2..=1000) };
                    match post_ids(&client, &urls[worker], count).await.unwrap() {
                        Issued::Ids(ids) => {
                            assert_eq!(ids.len(), count as usize);
                            issued += ids.len();
                            if count == 1 {
                                singles += 1
                            } else {
                                batches += 1
                            }
                            streams[worker].extend(ids);
                        }
                        Issued::Refused { status, code } => {
                            panic!("task {task}: worker {worker} refused: {status} {code}")
                        }
                    }
                }
                (streams, singles, batches)
            })
        })
        .collect();

    let mut all = Vec::with_capacity(target + 10_000);
    let mut by_worker_machines: Vec<HashSet<u32>> = vec![HashSet::new(); workers.len()];
    let (mut singles, mut batches) = (0, 0);
    for task in tasks {
        let (streams, s, b) = task.await.unwrap();
        singles += s;
        batches += b;
        for (worker, stream) in streams.into_iter().enumerate() {
            assert!(stream.windows(2).all(|w| w[0] < w[1]), "worker {worker}'s IDs must strictly increase");
            by_worker_machines[worker].extend(stream.iter().map(|id| v1_fields(*id).1));
            all.extend(stream);
        }
    }
    let elapsed = started.elapsed();
    for (worker, seen) in by_worker_machines.iter().enumerate() {
        assert_eq!(
            seen,
            &HashSet::from([machines[worker]]),
            "worker {worker} issued only under its own machine number"
        );
    }
    let checked = assert_no_duplicates(&mut all);
    assert!(checked >= target);
    println!(
        "e2e: {checked} IDs from 3 workers ({singles} single requests, {batches} batches) in {elapsed:?}, \
         {:.0} IDs/s; machines {machines:?}; no duplicates",
        checked as f64 / elapsed.as_secs_f64()
    );
    for worker in workers {
        assert!(worker.stop().await.unwrap().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_frozen_worker_refuses_after_its_number_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let client = client();
    let mut all_ids: Vec<u64> = Vec::new();

    // Two workers share the numbers 10 and 11, so that once the frozen worker has lost its
    // number it cannot claim another until the second worker leaves: on waking it can only refuse.
    let pair = |name: &str| WorkerSpec { machines: (10, 11), ..WorkerSpec::short_lease(name, &db) };
    let frozen = WorkerProcess::start(&pair("frozen")).await.unwrap();
    let machine = frozen.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let other = WorkerProcess::start(&pair("other")).await.unwrap();
    let other_machine = other.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    assert_ne!(machine, other_machine);

    let mut frozen_ids = Vec::new();
    for _ in 0..50 {
        let Issued::Ids(ids) = post_ids(&client, &frozen.url, 100).await.unwrap() else {
            panic!("refused before the freeze")
        };
        frozen_ids.extend(ids);
    }
    assert!(frozen_ids.iter().all(|id| v1_fields(*id).1 == machine));

    // Freeze it until its lease has expired and another worker holds the number.
    frozen.freeze().await.unwrap();

    // Requests sent to the frozen worker wait in its socket backlog until it wakes.
    let queued: Vec<_> = (0..16)
        .map(|i| {
            let url = frozen.url.clone();
            let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
            tokio::spawn(async move { post_ids(&client, &url, if i % 2 == 0 { 1 } else { 50 }).await.unwrap() })
        })
        .collect();

    // A fourth worker, restricted to the frozen worker's number, claims it once the lease expires.
    let successor_spec = WorkerSpec { machines: (machine, machine), ..WorkerSpec::short_lease("successor", &db) };
    let successor = WorkerProcess::start(&successor_spec).await.unwrap();
    assert_eq!(successor.wait_ready(&client, Duration::from_secs(15)).await.unwrap(), machine);
    let mut successor_ids = Vec::new();
    for _ in 0..50 {
        let Issued::Ids(ids) = post_ids(&client, &successor.url, 100).await.unwrap() else {
            panic!("successor refused")
        };
        successor_ids.extend(ids);
    }

    // Wake the frozen worker: every request refuses; none is issued under the lost number.
    frozen.signal(libc::SIGCONT);
    for task in queued {
        match task.await.unwrap() {
            Issued::Refused { status, code } => assert_eq!((status, code.as_str()), (503, "lease")),
            Issued::Ids(ids) => panic!("the woken worker issued {} IDs (machine {})", ids.len(), v1_fields(ids[0]).1),
        }
    }
    // Its next renewal fails: it drops the number and, finding none free, stays not-ready.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, health) = frozen.health(&client).await.unwrap();
        assert_eq!((status, health["reason"].as_str()), (503, Some("lease")), "{health}");
        if health["leases"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the lost number was never dropped: {health}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Once the other worker leaves (releasing its number), the woken worker claims it and serves.
    assert!(other.stop().await.unwrap().success());
    let new_machine = frozen.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    assert_eq!(new_machine, other_machine);
    let mut after_wake = Vec::new();
    for _ in 0..20 {
        let Issued::Ids(ids) = post_ids(&client, &frozen.url, 100).await.unwrap() else {
            panic!("refused after re-claim")
        };
        assert!(ids.iter().all(|id| v1_fields(*id).1 == new_machine));
        after_wake.extend(ids);
    }

    // The two holders of the number never share a timestamp.
    let last_frozen_ms = frozen_ids.iter().map(|id| v1_fields(*id).0).max().unwrap();
    let first_successor_ms = successor_ids.iter().map(|id| v1_fields(*id).0).min().unwrap();
    assert!(last_frozen_ms < first_successor_ms, "{last_frozen_ms} < {first_successor_ms}");

    all_ids.extend(frozen_ids);
    all_ids.extend(successor_ids);
    all_ids.extend(after_wake);
    let checked = assert_no_duplicates(&mut all_ids);
    println!(
        "e2e freeze: machine {machine} taken over while frozen; 16 of 16 queued requests refused on wake; re-claimed {new_machine}; {checked} IDs, no duplicates"
    );

    // The audit log shows the takeover and the failed renewal.
    let history = audit_rows(&db, machine).await;
    assert!(history.iter().filter(|(event, _)| event == "claim").count() >= 2, "two claims of {machine}: {history:?}");
    assert!(history.iter().any(|(event, _)| event == "renew_failed"), "{history:?}");
    successor.stop().await.unwrap();
    frozen.stop().await.unwrap();
}

async fn audit_rows(db: &std::path::Path, machine: u32) -> Vec<(String, String)> {
    let store = SqliteLeaseStore::open(db, "idgen-leases").await.unwrap();
    let events = store.history(Some(machine), 0, i64::MAX).await.unwrap();
    events.into_iter().map(|event| (event.kind.as_str().to_owned(), event.holder)).collect()
}
