//! End-to-end: three real worker processes on one SQLite lease table and a million IDs from
//! concurrent clients. Every ID of the run is collected and checked for repeats.

use std::collections::HashSet;
use std::time::{Duration, Instant};

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
