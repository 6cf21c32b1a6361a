//! End to end with the region registry: two regions of three workers each switch from v1 to v2
//! at a cutover a few seconds into the test while clients mint across it; and a worker whose copy
//! of the schedule has gone stale (registry down, horizon passed) refuses instead of issuing.

use std::time::{Duration, Instant};

use idgen_e2e::{
    Issued, RegistryProcess, Store, WorkerProcess, WorkerSpec, assert_no_duplicates, now_unix_ms, post_ids, worker_exit,
};

const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

fn worker_spec(name: &str, region: &str, registry: &str, dir: &std::path::Path, refresh_ms: u64) -> WorkerSpec {
    let mut spec = WorkerSpec::short_lease_on(name, Store::Sqlite(dir.join(format!("{region}-leases.db"))));
    (spec.lease_ms, spec.renew_interval_ms, spec.fence_ms) = (30_000, 1_000, 500);
    spec.extra = format!(
        "region = \"{region}\"\nregistry_url = \"{registry}\"\nregistry_refresh_ms = {refresh_ms}\nschedule_cache = \"{}\"\n",
        dir.join(format!("{name}-schedule.json")).display()
    );
    spec
}

/// Polls until the worker holds a lease under `layout` (it may still be refusing for other reasons).
async fn wait_for_lease(client: &reqwest::Client, worker: &WorkerProcess, layout: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, health) = worker.health(client).await.unwrap();
        if health["leases"].as_array().is_some_and(|l| l.iter().any(|lease| lease["layout"] == layout)) {
            return;
        }
        assert!(Instant::now() < deadline, "{} never claimed under {layout}: {health}", worker.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_two_regions_switch_to_v2_at_the_cutover() {
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    let cutover_unix_ms = now_unix_ms() + 8_000;
    let registry =
        RegistryProcess::start(&format!("initial_v2_from_ms = {}\n", cutover_unix_ms - EPOCH_UNIX_MS)).await.unwrap();
    assert_eq!(registry.add_region(&client, "us-east-1").await.unwrap(), 0);
    assert_eq!(registry.add_region(&client, "eu-west-1").await.unwrap(), 1);

    // The published schedule reproduces SPEC §1's test vectors (v2 has moved, v1 has not).
    let decoded: serde_json::Value =
        client.get(format!("{}/v1/layouts", registry.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(decoded["layouts"][1]["from_ms"].as_i64().unwrap(), cutover_unix_ms - EPOCH_UNIX_MS);

    let regions = [("us-east-1", 0u32), ("eu-west-1", 1u32)];
    let mut fleets: Vec<Vec<WorkerProcess>> = Vec::new();
    for (region, _) in regions {
        let mut fleet = Vec::new();
        for i in 1..=3 {
            let spec = worker_spec(&format!("{region}-{i}"), region, &registry.url, dir.path(), 1_000);
            fleet.push(WorkerProcess::start(&spec).await.unwrap());
        }
        fleets.push(fleet);
    }
    // Before the cutover every worker has claimed its number in the v2 lease table too.
    for fleet in &fleets {
        for worker in fleet {
            wait_for_lease(&client, worker, "v2", Duration::from_secs(10)).await;
        }
    }
    for worker in &fleets[0] {
        wait_for_lease(&client, worker, "v1", Duration::from_secs(10)).await;
    }
    assert!(now_unix_ms() < cutover_unix_ms - 1_000, "the fleet took too long to start for this test");

    // Clients mint continuously in both regions until 3 s past the cutover.
    let stop_at = cutover_unix_ms + 3_000;
    let mut tasks = Vec::new();
    for (r, fleet) in fleets.iter().enumerate() {
        for t in 0..3 {
            let urls: Vec<String> = fleet.iter().map(|w| w.url.clone()).collect();
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut issued: Vec<(usize, Vec<u64>)> = Vec::new();
                let mut refusals: Vec<(i64, String)> = Vec::new();
                let mut n = 0usize;
                while now_unix_ms() < stop_at {
                    let worker = (t + n) % urls.len();
                    let count = if n.is_multiple_of(3) { 1 } else { 1 + (n as u32 * 37) % 200 };
                    let started = now_unix_ms();
                    match post_ids(&client, &urls[worker], count).await.unwrap() {
                        Issued::Ids(ids) => issued.push((worker, ids)),
                        Issued::Refused { code, .. } => refusals.push((started, code)),
                    }
                    n += 1;
                }
                (r, issued, refusals)
            }));
        }
    }

    let mut all = Vec::new();
    let (mut before, mut after) = (0usize, 0usize);
    for task in tasks {
        let (r, issued, refusals) = task.await.unwrap();
        let (region, number) = regions[r];
        for (started, code) in &refusals {
            // Only a region without v1 rights may refuse, and only before the cutover.
            assert!(
                r == 1 && code == "schedule" && *started < cutover_unix_ms,
                "{region} refused at {started} ({code}); cutover {cutover_unix_ms}"
            );
        }
        let mut last_by_worker = [0u64; 3];
        for (worker, ids) in issued {
            assert!(ids[0] > last_by_worker[worker] && ids.windows(2).all(|w| w[0] < w[1]), "{region}: not increasing");
            last_by_worker[worker] = *ids.last().unwrap();
            for id in ids {
                let unix_ms = (id >> 22) as i64 + EPOCH_UNIX_MS;
                if unix_ms < cutover_unix_ms {
                    assert_eq!(r, 0, "only the home region issues v1");
                    before += 1;
                } else {
                    assert_eq!((id >> 19) & 0x7, u64::from(number), "{region}'s v2 IDs carry its region number");
                    after += 1;
                }
                all.push(id);
            }
        }
    }
    assert!(before > 0 && after > 0, "IDs on both sides of the cutover: {before} before, {after} after");

    // The official decoder agrees, including the region's name.
    let sample = *all.iter().max().unwrap();
    let decoded: serde_json::Value =
        client.get(format!("{}/v1/ids/{sample}/decode", fleets[0][0].url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(decoded["layout"], "v2");
    assert!(decoded["region"] == "us-east-1" || decoded["region"] == "eu-west-1", "{decoded}");

    let checked = assert_no_duplicates(&mut all);
    println!(
        "cutover: {checked} IDs ({before} v1 before the cutover, {after} v2 after) from 2 regions × 3 workers; no duplicates"
    );
    for fleet in fleets {
        for worker in fleet {
            worker.stop().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_stale_schedule_refuses_instead_of_issuing() {
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    // A horizon only 5 s ahead: a copy of the schedule goes stale 5 s after the registry is gone.
    let mut registry = RegistryProcess::start("horizon_lead_ms = 5000\n").await.unwrap();
    registry.add_region(&client, "us-east-1").await.unwrap();
    let spec = worker_spec("stale", "us-east-1", &registry.url, dir.path(), 300);
    let worker = WorkerProcess::start(&spec).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let mut ids = Vec::new();
    let Issued::Ids(batch) = post_ids(&client, &worker.url, 100).await.unwrap() else { panic!("refused") };
    ids.extend(batch);

    // The registry goes away; the worker restarts during the outage from its disk copy.
    registry.child.kill().await.unwrap();
    let stopped_at = now_unix_ms();
    worker.stop().await.unwrap();
    let worker = WorkerProcess::start(&spec).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let Issued::Ids(batch) = post_ids(&client, &worker.url, 100).await.unwrap() else {
        panic!("refused after a restart from the disk copy")
    };
    ids.extend(batch);

    // Once the copy's horizon has passed, it refuses (503 schedule) — never issues.
    let deadline = Instant::now() + Duration::from_secs(15);
    let refused_at = loop {
        match post_ids(&client, &worker.url, 10).await.unwrap() {
            Issued::Ids(batch) => ids.extend(batch),
            Issued::Refused { status, code } => {
                assert_eq!((status, code.as_str()), (503, "schedule"));
                break now_unix_ms();
            }
        }
        assert!(Instant::now() < deadline, "still issuing long after the horizon");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let newest = ids.iter().map(|id| (id >> 22) as i64 + EPOCH_UNIX_MS).max().unwrap();
    let (status, health) = worker.health(&client).await.unwrap();
    assert_eq!((status, health["reason"].as_str()), (503, Some("schedule")), "{health}");
    for _ in 0..5 {
        assert!(matches!(post_ids(&client, &worker.url, 5).await.unwrap(), Issued::Refused { status: 503, .. }));
    }
    let checked = assert_no_duplicates(&mut ids);
    println!(
        "stale schedule: registry gone at {stopped_at}, restart from the disk copy served, refused from {refused_at} \
         (newest ID at {newest}); {checked} IDs, no duplicates"
    );
    worker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_operator_commands_against_the_registry() {
    let registry = RegistryProcess::start("").await.unwrap();
    let url = registry.url.as_str();
    let token = registry.token.as_str();
    let run = |args: Vec<&str>| {
        let mut full = vec!["--registry", url, "--token", token];
        full.extend(args);
        full.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let idgen = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idgen_e2e::idgen(&args).await.unwrap()
    };
    // `idgen regions ARGS…` against this registry, its output or its failure.
    let regions = |args: Vec<&str>| {
        let mut full = vec!["regions".to_owned()];
        full.extend(run(args));
        async move {
            let full: Vec<&str> = full.iter().map(String::as_str).collect();
            idgen_e2e::idgen(&full).await.map_err(|error| error.to_string())
        }
    };
    let mut args = vec!["regions".to_owned()];
    args.extend(run(vec!["add", "us-east-1"]));
    assert!(idgen(args).await.contains("number 0"));
    let mut args = vec!["regions".to_owned()];
    args.extend(run(vec!["add", "eu-west-1"]));
    assert!(idgen(args).await.contains("number 1"));
    // The home region, while v1 (no region bits: only it issues) is in force: refused.
    let refused = regions(vec!["retire", "us-east-1", "--confirm", "us-east-1"]).await.unwrap_err();
    assert!(refused.contains("409") && refused.contains("home region") && refused.contains("v1"), "{refused}");
    let retired = regions(vec!["retire", "eu-west-1", "--confirm", "eu-west-1", "--now"]).await.unwrap();
    assert!(retired.contains("never be reused"), "{retired}");
    let mut args = vec!["regions".to_owned()];
    args.extend(run(vec!["add", "eu-west-1"]));
    assert!(idgen(args).await.contains("number 2"), "a retired number is not handed out again");
    let mut args = vec!["regions".to_owned()];
    args.extend(run(vec!["--json", "list"]));
    let listed: serde_json::Value = serde_json::from_str(&idgen(args).await).unwrap();
    assert_eq!(listed["numbers_left"], 5);

    // A retirement a grace ahead (24 h, the default): shown, refused with a typo, cancelled.
    regions(vec!["add", "ap-south-1"]).await.unwrap();
    let typo = regions(vec!["retire", "ap-south-1", "--confirm", "ap-south-2"]).await.unwrap_err();
    assert!(typo.contains("400") && typo.contains("must be the same"), "{typo}");
    let scheduled = regions(vec!["retire", "ap-south-1", "--confirm", "ap-south-1"]).await.unwrap();
    assert!(scheduled.contains("retires at") && scheduled.contains("cancel-retire ap-south-1"), "{scheduled}");
    let listed: serde_json::Value = serde_json::from_str(&regions(vec!["--json", "list"]).await.unwrap()).unwrap();
    let retires_at = listed["regions"][3]["retires_at"].as_str().unwrap().to_owned();
    assert_eq!(listed["regions"][3]["status"], "active", "{listed}");
    let listed = regions(vec!["list"]).await.unwrap();
    let row = listed.lines().find(|l| l.split_whitespace().any(|cell| cell == "ap-south-1")).unwrap();
    assert!(listed.lines().next().unwrap().contains("RETIRES") && row.contains(&retires_at), "{listed}");
    let cancelled = regions(vec!["cancel-retire", "ap-south-1", "--confirm", "ap-south-1"]).await.unwrap();
    assert!(cancelled.contains("cancelled"), "{cancelled}");
    let listed: serde_json::Value = serde_json::from_str(&regions(vec!["--json", "list"]).await.unwrap()).unwrap();
    assert!(listed["regions"][3].get("retires_at").is_none(), "{listed}");

    let mut args = vec!["layouts".to_owned()];
    args.extend(run(vec![
        "schedule",
        "v3",
        "--region-bits",
        "4",
        "--machine-bits",
        "8",
        "--sequence-bits",
        "10",
        "--from",
        "2040-01-01T00:00:00Z",
    ]));
    idgen(args).await;
    let mut args = vec!["layouts".to_owned()];
    args.extend(run(vec!["show"]));
    let shown = idgen(args).await;
    assert!(
        shown.contains("v3") && shown.contains("2040-01-01T00:00:00.000Z") && shown.contains("home region us-east-1"),
        "{shown}"
    );

    // Decoding with the registry's schedule names the region.
    let decoded = idgen_e2e::idgen(&["decode", "--registry", url, "--json", "683244571854022659"]).await.unwrap();
    let decoded: serde_json::Value = serde_json::from_str(&decoded).unwrap();
    assert_eq!(
        (decoded["region"].as_str(), decoded["region_number"].as_u64()),
        (Some("eu-west-1"), Some(2)),
        "{decoded}"
    );
    // A write without the token is refused.
    let refused = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["regions", "--registry", url, "--token", "not-the-token-not-the-token", "add", "x-1"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    println!(
        "operator commands: regions add/retire (home refused, typo refused, a grace ahead, at once)/cancel-retire/list, \
         layouts schedule/show and decode --registry all worked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_leases_commands_follow_the_registrys_schedule() {
    // Before, `idgen leases` chose the lease table by the built-in schedule (v1 until 2028), so
    // with the registry's v2 already in force it listed and quarantined in the wrong table.
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    let v2_from_unix_ms = now_unix_ms() - 60_000;
    let registry =
        RegistryProcess::start(&format!("initial_v2_from_ms = {}\n", v2_from_unix_ms - EPOCH_UNIX_MS)).await.unwrap();
    registry.add_region(&client, "us-east-1").await.unwrap();
    assert_eq!(registry.add_region(&client, "eu-west-1").await.unwrap(), 1);
    let spec = worker_spec("eu-1", "eu-west-1", &registry.url, dir.path(), 1_000);
    let worker = WorkerProcess::start(&spec).await.unwrap();
    wait_for_lease(&client, &worker, "v2", Duration::from_secs(10)).await;
    let Issued::Ids(ids) = post_ids(&client, &worker.url, 1).await.unwrap() else { panic!("eu-west-1 refused") };
    let id = ids[0];
    let machine = (id >> 10) & 0x1ff;
    let config = dir.path().join("eu-1.toml");
    std::fs::write(&config, spec.toml()).unwrap();
    let config = config.to_str().unwrap();

    let listed: serde_json::Value =
        serde_json::from_str(&idgen_e2e::idgen(&["leases", "--config", config, "--json", "list"]).await.unwrap())
            .unwrap();
    let rows = listed.as_array().unwrap();
    assert!(rows.iter().any(|r| r["machine_id"] == machine && r["state"] == "held"), "the v2 table: {listed}");

    // Quarantine by the ID: the layout and the machine number come from the ID itself.
    let quarantined =
        idgen_e2e::idgen(&["leases", "--config", config, "--json", "quarantine", "--id", &id.to_string()])
            .await
            .unwrap();
    let quarantined: serde_json::Value = serde_json::from_str(&quarantined).unwrap();
    assert_eq!((quarantined["layout"].as_str(), quarantined["machine_id"].as_u64()), (Some("v2"), Some(machine)));
    assert_eq!(quarantined["state"], "quarantined");
    // An ID made in another region is refused: its number lives in that region's table.
    let other_region = (id & !(0b111 << 19)) | (2 << 19);
    let refused = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["leases", "--config", config, "quarantine", "--id", &other_region.to_string()])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("region number 2"), "{refused:?}");
    // A v1 ID (SPEC §1's vector, before the cutover) is the home region's; this is eu-west-1.
    let refused = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["leases", "--config", config, "quarantine", "--id", "97301141913751557"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("only the home region"), "{refused:?}");
    // With the layout and number given, the registry is not needed: it works while it is down.
    let offline = dir.path().join("offline.toml");
    let unreachable =
        spec.toml().replace(&registry.url, "http://127.0.0.1:9").replace("eu-1-schedule.json", "none.json");
    std::fs::write(&offline, unreachable).unwrap();
    let listed = idgen_e2e::idgen(&[
        "leases",
        "--config",
        offline.to_str().unwrap(),
        "--layout",
        "v2",
        "--json",
        "get",
        &machine.to_string(),
    ])
    .await
    .unwrap();
    assert!(listed.contains("quarantined"), "{listed}");

    // Lifting keeps the number out for at least the longest lease any generator may hold.
    let before = now_unix_ms();
    let lifted = idgen_e2e::idgen(&[
        "leases",
        "--config",
        config,
        "--layout",
        "v2",
        "--json",
        "release-quarantine",
        &machine.to_string(),
    ])
    .await
    .unwrap();
    let lifted: serde_json::Value = serde_json::from_str(&lifted).unwrap();
    assert!(lifted["claimable_after_ms"].as_i64().unwrap() >= before + idgen::MAX_LEASE_MS, "{lifted}");
    worker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_registry_started_over_is_refused_by_every_worker_old_host_or_new() {
    // Before, a host with a copy of the old registry on disk refused the new one, but a new host
    // took it: region numbers from 0 again, under a region's own lease tables.
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    let registry = RegistryProcess::start("").await.unwrap();
    assert_eq!(registry.add_region(&client, "us-east-1").await.unwrap(), 0);
    let old_host = worker_spec("old-host", "us-east-1", &registry.url, dir.path(), 1_000);
    let worker = WorkerProcess::start(&old_host).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    assert!(worker.stop().await.unwrap().success());

    // The registry starts over: a new database, the region added again, number 0 again: the same
    // answers but for the registry's identity.
    let reset = RegistryProcess::start("").await.unwrap();
    assert_eq!(reset.add_region(&client, "us-east-1").await.unwrap(), 0);
    let moved = |spec: &WorkerSpec| WorkerSpec { extra: spec.extra.replace(&registry.url, &reset.url), ..spec.clone() };
    // The old host: its copy on disk names the first registry.
    let (status, stderr) = worker_exit(&moved(&old_host)).await.expect("refused at its start");
    assert!(!status.success() && stderr.contains("started over"), "{stderr}");
    // A new host, no copy on disk: the lease table's genesis names the first registry.
    for create_tables in [true, false] {
        let new_host =
            WorkerSpec { create_tables, ..worker_spec("new-host", "us-east-1", &reset.url, dir.path(), 1_000) };
        let (status, stderr) = worker_exit(&new_host).await.expect("refused at its start");
        assert!(!status.success() && stderr.contains("started over"), "create_tables = {create_tables}: {stderr}");
    }
}
