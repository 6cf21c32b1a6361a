//! A client that survives losing its region (design notes, trace 2), end to end: `idgen up` with
//! two regions past the v2 cutover, a client streaming IDs from region a with region b as its
//! backup; every region-a worker is SIGKILLed, `up` starts them again (as systemd would), and the
//! client moves back on its health probe. The caller sees no error throughout; every ID is
//! collected and none repeats.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idgen_client::{Client, ClientConfig};

/// The worker's health if it issues (200 `"ok"`; before the cutover region b answers 200
/// `"standby"`, refusing every ID).
async fn healthy(http: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    let response = http.get(format!("{url}/healthz")).send().await.ok()?;
    if response.status() != 200 {
        return None;
    }
    let body: serde_json::Value = response.json().await.ok()?;
    (body["status"] == "ok").then_some(body)
}

/// The PID in a holder, `<host>/pid-<pid>/<start>/<nonce>`.
fn pid_of(holder: &str) -> i32 {
    holder.split('/').find_map(|part| part.strip_prefix("pid-")).and_then(|p| p.parse().ok()).unwrap()
}

struct Minted {
    at: Instant,
    id: u64,
    region: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_client_fails_over_to_the_backup_region_and_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut up, port) =
        idgen_e2e::start_up(dir.path(), &["--regions", "a,b", "--cutover-in", "2s", "--restart-after", "3s"]).await;

    let (registry, local, backup) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{}", port + 1),
        format!("http://127.0.0.1:{}", port + 11),
    );
    let region_a: Vec<String> = (1..=3).map(|i| format!("http://127.0.0.1:{}", port + i)).collect();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    // Past the cutover, region b issues too (under v2, with its own number).
    let deadline = Instant::now() + Duration::from_secs(20);
    while healthy(&http, &backup).await.is_none() {
        assert!(Instant::now() < deadline, "region b never issued after the cutover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut config = ClientConfig::new(local.clone());
    config.backups = vec![backup.clone()];
    config.registry_url = Some(registry);
    config.probe_interval_ms = 200;
    (config.prefetch.batch, config.prefetch.low_water, config.prefetch.validity_ms) = (50, 10, 2_000);
    let client = Client::new(config).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut minted = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let id = client.next_id().await.expect("the caller never sees an error while an endpoint answers");
                let region = client.decode(id).unwrap().region_number.expect("v2 IDs carry a region");
                minted.push(Minted { at: Instant::now(), id, region });
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            minted
        })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // SIGKILL every region-a worker.
    let mut pids = Vec::new();
    for url in &region_a {
        let health = healthy(&http, url).await.expect("region a's workers serve before the kill");
        pids.push(pid_of(health["holder"].as_str().unwrap()));
    }
    for pid in &pids {
        // SAFETY: signals a worker process of this test's `idgen up`.
        assert_eq!(unsafe { libc::kill(*pid, libc::SIGKILL) }, 0);
    }
    let killed_at = Instant::now();
    // `up` starts them again after 3 s; the probe (every 200 ms) moves the client back.
    let deadline = Instant::now() + Duration::from_secs(30);
    let back_up_at = loop {
        if healthy(&http, &local).await.is_some() {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "region a's worker never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    while client.endpoint() != local {
        assert!(
            back_up_at.elapsed() < Duration::from_secs(2),
            "the client did not move back within the probe interval"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let moved_back = back_up_at.elapsed();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stop.store(true, Ordering::SeqCst);
    let minted = stream.await.unwrap();

    let (a, b) = (0, 1);
    let first_b = minted.iter().position(|m| m.region == b).expect("after the kill, IDs carry region b's number");
    assert!(minted[..first_b].iter().all(|m| m.region == a), "before the kill, region a only");
    assert!(minted[first_b].at >= killed_at, "region b only after region a was killed");
    let last = minted.last().unwrap();
    assert_eq!(last.region, a, "back on region a at the end");
    let from_b = minted.iter().filter(|m| m.region == b).count();
    let back_on_a = minted.iter().skip(first_b).filter(|m| m.region == a).count();
    assert!(from_b > 0 && back_on_a > 0);
    for region in [a, b] {
        let ids: Vec<u64> = minted.iter().filter(|m| m.region == region).map(|m| m.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "region {region}'s IDs are increasing");
    }
    let mut ids: Vec<u64> = minted.iter().map(|m| m.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), minted.len(), "no ID twice");
    println!(
        "failover: {} IDs, none twice, no caller-visible error; first region-b ID {:?} after the kill; {from_b} from \
         region b; region a back after {:?}, the client moved back {moved_back:?} later; {back_on_a} from region a since",
        minted.len(),
        minted[first_b].at.duration_since(killed_at),
        back_up_at.duration_since(killed_at),
    );

    // SAFETY: signals our own child.
    unsafe { libc::kill(up.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait()).await.unwrap().unwrap();
    assert!(status.success(), "idgen up stopped with {status}");
}
