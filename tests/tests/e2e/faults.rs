//! The fault matrix (SPEC §2–§3), end to end: real `idgen worker` processes, the lease table on a
//! DynamoDB-protocol server on loopback (moto) — and, for the freeze, on SQLite too — broken with
//! real signals, a stopped table, a quarantine, a stepped clock (libfaketime) and a full range.
//! Every test collects every ID issued during it and asserts that none repeats.

use std::time::{Duration, Instant};

use idgen_e2e::{
    Issued, MotoServer, Store, WorkerProcess, WorkerSpec, assert_no_duplicates, idgen, now_unix_ms, open_store,
    post_ids, shared_dynamodb_endpoint, unique_table, v1_fields, worker_exit,
};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

fn dynamodb(prefix: &str) -> Store {
    Store::Dynamodb { endpoint: shared_dynamodb_endpoint(), table: unique_table(prefix) }
}

async fn issue_ok(client: &reqwest::Client, worker: &WorkerProcess, count: u32) -> Vec<u64> {
    match post_ids(client, &worker.url, count).await.unwrap() {
        Issued::Ids(ids) => ids,
        Issued::Refused { status, code } => panic!("{} refused: {status} {code}", worker.name),
    }
}

/// Polls until `/healthz` says 503 with this reason and no lease held.
async fn wait_refusing_without_lease(client: &reqwest::Client, worker: &WorkerProcess, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (status, health) = worker.health(client).await.unwrap();
        if status == 503 && health["reason"] == "lease" && health["leases"].as_array().is_some_and(|l| l.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "{} never dropped its lease: {status} {health}", worker.name);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `/healthz` says 200 under a v1 machine number other than `old`, and returns it.
async fn wait_issuing_under_another_number(
    client: &reqwest::Client,
    worker: &WorkerProcess,
    old: u32,
    within: Duration,
) -> u32 {
    let deadline = Instant::now() + within;
    loop {
        let (status, health) = worker.health(client).await.unwrap();
        let held = health["leases"][0]["machine"].as_u64().map(|m| m as u32);
        if status == 200
            && let Some(machine) = held.filter(|&m| m != old)
        {
            return machine;
        }
        assert!(Instant::now() < deadline, "never moved off the quarantined number: {health}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Worker freezes past its lease.

async fn frozen_worker_scenario(store: Store) {
    let client = client();
    let mut all_ids: Vec<u64> = Vec::new();

    // Two workers share the numbers 10 and 11, so that once the frozen worker has lost its
    // number it cannot claim another until the second worker leaves: on waking it can only refuse.
    let pair = |name: &str| WorkerSpec { machines: (10, 11), ..WorkerSpec::short_lease_on(name, store.clone()) };
    let frozen = WorkerProcess::start(&pair("frozen")).await.unwrap();
    let machine = frozen.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let other = WorkerProcess::start(&pair("other")).await.unwrap();
    let other_machine = other.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    assert_ne!(machine, other_machine);

    let mut frozen_ids = Vec::new();
    for _ in 0..50 {
        frozen_ids.extend(issue_ok(&client, &frozen, 100).await);
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
    let successor_spec =
        WorkerSpec { machines: (machine, machine), ..WorkerSpec::short_lease_on("successor", store.clone()) };
    let successor = WorkerProcess::start(&successor_spec).await.unwrap();
    assert_eq!(successor.wait_ready(&client, Duration::from_secs(15)).await.unwrap(), machine);
    let mut successor_ids = Vec::new();
    for _ in 0..50 {
        successor_ids.extend(issue_ok(&client, &successor, 100).await);
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
    wait_refusing_without_lease(&client, &frozen, Duration::from_secs(10)).await;

    // Once the other worker leaves (releasing its number), the woken worker claims it and serves.
    assert!(other.stop().await.unwrap().success());
    let new_machine = frozen.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    assert_eq!(new_machine, other_machine);
    let mut after_wake = Vec::new();
    for _ in 0..20 {
        let ids = issue_ok(&client, &frozen, 100).await;
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
        "freeze ({store:?}): machine {machine} taken over while frozen; 16 of 16 queued requests refused on wake; \
         re-claimed {new_machine}; {checked} IDs, no duplicates"
    );

    // The audit log shows the takeover; the woken worker did not try to renew the lease it had
    // held past its fence (that would be a renewal of a lost lease): it counted it lapsed and
    // claimed afresh.
    let history = open_store(&store).await.unwrap().history(Some(machine), 0, i64::MAX).await.unwrap();
    let claims: Vec<_> = history.iter().filter(|e| e.kind == idgen::AuditKind::Claim).collect();
    assert!(claims.len() >= 2 && claims.iter().any(|e| e.holder != claims[0].holder), "{history:?}");
    let lapsed = r#"idgen_lease_events_total{layout="v1",event="lease_lapsed"}"#;
    assert!(series(&client, &frozen, lapsed).await >= 1, "{}", frozen.metrics(&client).await.unwrap());
    successor.stop().await.unwrap();
    frozen.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_freeze_past_the_lease_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    frozen_worker_scenario(Store::Sqlite(dir.path().join("leases.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_freeze_past_the_lease_on_dynamodb() {
    frozen_worker_scenario(dynamodb("freeze")).await;
}

// ---------------------------------------------------------------------------------------------
// Worker killed (SIGKILL) and restarted at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_killed_and_restarted_worker_is_a_new_holder() {
    let client = client();
    let store = dynamodb("kill9");
    let spec = WorkerSpec { machines: (20, 20), ..WorkerSpec::short_lease_on("first", store.clone()) };
    let first = WorkerProcess::start(&spec).await.unwrap();
    assert_eq!(first.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 20);
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.extend(issue_ok(&client, &first, 100).await);
    }
    let first_holder = first.health(&client).await.unwrap().1["holder"].as_str().unwrap().to_owned();
    let mut first = first;
    first.signal(libc::SIGKILL);
    first.child.wait().await.unwrap();
    let table = open_store(&store).await.unwrap();
    let stored = table.get(20).await.unwrap().unwrap();
    assert_eq!(stored.holder, first_holder, "a killed process cannot release");

    // Restarted at once: a new process is a new holder and must wait out the stored expiry.
    let second = WorkerProcess::start(&WorkerSpec { name: "second".into(), ..spec.clone() }).await.unwrap();
    let (status, health) = second.health(&client).await.unwrap();
    if now_unix_ms() < stored.lease_expiry {
        assert_eq!((status, health["reason"].as_str()), (503, Some("lease")), "{health}");
    }
    assert_eq!(second.wait_ready(&client, Duration::from_secs(15)).await.unwrap(), 20);
    let claimed = table.get(20).await.unwrap().unwrap();
    assert_ne!(claimed.holder, first_holder);
    assert_eq!(claimed.lease_epoch, stored.lease_epoch + 1);
    let mut second_ids = Vec::new();
    for _ in 0..30 {
        second_ids.extend(issue_ok(&client, &second, 100).await);
    }
    let first_second_ms = second_ids.iter().map(|id| v1_fields(*id).0).min().unwrap();
    assert!(first_second_ms > stored.lease_expiry, "the new holder starts after the stored expiry");
    ids.extend(second_ids);
    let checked = assert_no_duplicates(&mut ids);
    println!("kill -9: restarted process waited for expiry {}; {checked} IDs, no duplicates", stored.lease_expiry);
    second.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The clock steps back 3 ms and 2 s (libfaketime, offset file changed while the worker runs).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_clock_steps_back() {
    let client = client();
    let lib = std::env::var("IDGEN_FAKETIME_LIB")
        .expect("IDGEN_FAKETIME_LIB is not set (./scripts/test installs libfaketime)");
    let lib = lib.replace("libfaketime.so.1", "libfaketimeMT.so.1");
    let offset = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(offset.path(), "+0\n").unwrap();
    let mut spec = WorkerSpec::short_lease_on("stepped", dynamodb("clock"));
    (spec.lease_ms, spec.renew_interval_ms, spec.fence_ms) = (60_000, 1_000, 500);
    spec.env = vec![
        ("LD_PRELOAD".into(), lib),
        ("FAKETIME_TIMESTAMP_FILE".into(), offset.path().to_string_lossy().into_owned()),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    let worker = WorkerProcess::start(&spec).await.unwrap();
    let machine = worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();

    // A stream of requests, one after another, so every answer must be above the one before.
    let mut stream: Vec<u64> = Vec::new();
    let mut refusals = 0;
    let mut take = |issued: Issued, refusals: &mut u32| match issued {
        Issued::Ids(ids) => {
            assert!(stream.last().is_none_or(|last| *last < ids[0]), "IDs went backwards after a clock step");
            stream.extend(ids);
        }
        Issued::Refused { status, code } => {
            assert_eq!((status, code.as_str()), (503, "clock_behind"));
            *refusals += 1;
        }
    };
    for _ in 0..20 {
        take(post_ids(&client, &worker.url, 10).await.unwrap(), &mut refusals);
    }
    // 3 ms back, several times: waited out, never refused.
    for step in 1..=5 {
        std::fs::write(offset.path(), format!("-{:.3}\n", 0.003 * step as f64)).unwrap();
        for _ in 0..20 {
            take(post_ids(&client, &worker.url, 10).await.unwrap(), &mut refusals);
        }
    }
    assert_eq!(refusals, 0, "a step back of 3 ms is waited out, not refused");

    // 2 s back: 503 until the clock has caught up, then it serves again.
    std::fs::write(offset.path(), "-2.015\n").unwrap();
    let stepped_at = Instant::now();
    let mut served_again = None;
    while stepped_at.elapsed() < Duration::from_secs(6) {
        let before = refusals;
        take(post_ids(&client, &worker.url, 10).await.unwrap(), &mut refusals);
        if refusals == before && before > 0 {
            served_again = Some(stepped_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let served_again = served_again.expect("the worker refused after the 2 s step and served again once caught up");
    assert!(
        served_again >= Duration::from_millis(1_900),
        "refused until caught up, not just briefly: {served_again:?}"
    );
    let (_, health) = worker.health(&client).await.unwrap();
    assert_eq!(health["leases"][0]["machine"], machine, "a clock step back does not cost the lease: {health}");
    let metrics = client.get(format!("{}/metrics", worker.url)).send().await.unwrap().text().await.unwrap();
    let behind_events: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("idgen_clock_behind_events_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("clock-behind metric");
    assert!(behind_events >= refusals as f64 && behind_events > 0.0, "{behind_events}");
    let checked = assert_no_duplicates(&mut stream);
    println!(
        "clock steps: 5 steps of 3 ms waited out; a 2 s step refused {refusals} requests for {served_again:?}; \
         {behind_events} clock-behind events counted; {checked} IDs, strictly increasing, no duplicates"
    );
    worker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The lease table goes down while the worker serves.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_lease_table_down_issues_until_the_fence_then_recovers() {
    let client = client();
    let moto = MotoServer::start().await.unwrap();
    let spec = WorkerSpec::short_lease_on(
        "outage",
        Store::Dynamodb { endpoint: moto.endpoint.clone(), table: unique_table("down") },
    );
    let worker = WorkerProcess::start(&spec).await.unwrap();
    let machine = worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let mut ids = Vec::new();
    ids.extend(issue_ok(&client, &worker, 100).await);

    // Stop the table (SIGSTOP: connections hang, as with a network partition).
    moto.signal(libc::SIGSTOP);
    let down_at = Instant::now();
    let (mut served_while_down, mut first_refusal) = (0, None);
    while down_at.elapsed() < Duration::from_secs(8) {
        match post_ids(&client, &worker.url, 10).await.unwrap() {
            Issued::Ids(batch) => {
                assert!(first_refusal.is_none(), "issued again inside the fence while the table is down");
                served_while_down += batch.len();
                ids.extend(batch);
            }
            Issued::Refused { status, code } => {
                assert_eq!((status, code.as_str()), (503, "lease"));
                first_refusal.get_or_insert(down_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_refusal = first_refusal.expect("inside the fence the worker must refuse");
    assert!(served_while_down > 0, "it keeps issuing until the fence");
    // The fence is lease (3 s) − fence (0.5 s) after the last renewal, which is at most 1 s old.
    assert!(
        first_refusal >= Duration::from_millis(1_400) && first_refusal <= Duration::from_millis(2_700),
        "{first_refusal:?}"
    );

    // The table returns: the worker renews (nobody else took the number) or re-claims, and serves.
    moto.signal(libc::SIGCONT);
    let recovered_machine = worker.wait_ready(&client, Duration::from_secs(15)).await.unwrap();
    for _ in 0..10 {
        ids.extend(issue_ok(&client, &worker, 100).await);
    }
    let checked = assert_no_duplicates(&mut ids);
    println!(
        "table down: served {served_while_down} IDs, refused from {first_refusal:?} (fence), recovered on machine \
         {recovered_machine} (was {machine}); {checked} IDs, no duplicates"
    );
    worker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The lease is stolen by a quarantine (`idgen leases quarantine N`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_quarantine_takes_the_number_from_a_live_worker() {
    let client = client();
    let store = dynamodb("quarantine");
    let spec = WorkerSpec::short_lease_on("live", store.clone());
    let worker = WorkerProcess::start(&spec).await.unwrap();
    let machine = worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let mut ids = issue_ok(&client, &worker, 500).await;

    // The operator's command, against the worker's own configuration file.
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();
    let config_path = config.path().to_str().unwrap();
    let out = idgen(&["leases", "--config", config_path, "quarantine", &machine.to_string(), "--operator", "oncall"])
        .await
        .unwrap();
    assert!(out.contains("quarantined"), "{out}");
    let quarantined_at = now_unix_ms();

    // Its next renewal (≤ 1 s) fails: it stops issuing under the number and claims another.
    let new_machine = wait_issuing_under_another_number(&client, &worker, machine, Duration::from_secs(10)).await;
    for _ in 0..10 {
        let batch = issue_ok(&client, &worker, 100).await;
        assert!(batch.iter().all(|id| v1_fields(*id).1 == new_machine));
        ids.extend(batch);
    }
    let listed = idgen(&["leases", "--config", config_path, "--json", "get", &machine.to_string()]).await.unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["state"], "quarantined", "{listed}");
    let history = idgen(&["leases", "--config", config_path, "--json", "history", &machine.to_string()]).await.unwrap();
    let events: Vec<String> = serde_json::from_str::<serde_json::Value>(&history)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert!(events.contains(&"quarantine".to_owned()) && events.contains(&"renew_failed".to_owned()), "{events:?}");
    let stale: Vec<_> = ids
        .iter()
        .map(|id| v1_fields(*id))
        .filter(|(ms, m, _)| *m == machine && *ms > quarantined_at + 1_500)
        .collect();
    assert!(stale.is_empty(), "issued under the quarantined number after its renewal failed: {stale:?}");
    let checked = assert_no_duplicates(&mut ids);
    println!(
        "quarantine: machine {machine} quarantined, worker moved to {new_machine}; events {events:?}; {checked} IDs, no duplicates"
    );
    worker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Every number is taken: a range of 2, three workers.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_all_numbers_taken_the_third_worker_waits() {
    let client = client();
    let store = dynamodb("full");
    let spec = |name: &str| WorkerSpec { machines: (30, 31), ..WorkerSpec::short_lease_on(name, store.clone()) };
    let a = WorkerProcess::start(&spec("a")).await.unwrap();
    let b = WorkerProcess::start(&spec("b")).await.unwrap();
    a.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    b.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let c = WorkerProcess::start(&spec("c")).await.unwrap();
    let mut ids = Vec::new();
    let watch = Instant::now();
    let mut refusals = 0;
    while watch.elapsed() < Duration::from_secs(4) {
        match post_ids(&client, &c.url, 10).await.unwrap() {
            Issued::Refused { status, code } => {
                assert_eq!((status, code.as_str()), (503, "lease"));
                refusals += 1;
            }
            Issued::Ids(batch) => panic!("the third worker issued {} IDs without a number", batch.len()),
        }
        ids.extend(issue_ok(&client, &a, 10).await);
        ids.extend(issue_ok(&client, &b, 10).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, health) = c.health(&client).await.unwrap();
    assert_eq!((status, health["reason"].as_str()), (503, Some("lease")));
    let metrics = client.get(format!("{}/metrics", c.url)).send().await.unwrap().text().await.unwrap();
    let retries: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"idgen_lease_events_total{layout="v1",event="claim_all_taken"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(retries >= 3.0, "it retries with backoff: {retries} attempts\n{metrics}");

    // One leaves: the third claims its number and serves.
    let freed = a.wait_ready(&client, Duration::from_secs(1)).await.unwrap();
    a.stop().await.unwrap();
    assert_eq!(c.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), freed);
    ids.extend(issue_ok(&client, &c, 100).await);
    let checked = assert_no_duplicates(&mut ids);
    println!(
        "all taken: third worker refused {refusals} requests over 4 s with {retries} claim rounds, then took {freed}; {checked} IDs, no duplicates"
    );
    b.stop().await.unwrap();
    c.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
/// Runs one AWS CLI line (its arguments after `aws`, as a shell would take them) against
/// `endpoint`, and returns its JSON output (null if it printed none).
async fn aws_cli(endpoint: &str, args: &str) -> serde_json::Value {
    let aws = std::env::var("IDGEN_AWS_CLI").expect("IDGEN_AWS_CLI is not set (./scripts/test installs the AWS CLI)");
    let line = format!("{aws} --endpoint-url {endpoint} {args}");
    let output = tokio::process::Command::new("sh").arg("-c").arg(&line).output().await.unwrap();
    assert!(output.status.success(), "{line}\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
}

// The AWS CLI playbook (design notes R3.9, commands 1–3) works verbatim against our tables.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_aws_cli_playbook_commands_work_on_our_tables() {
    // A server of its own: the playbook names the production table, `idgen-leases-v2`.
    let moto = MotoServer::start().await.unwrap();
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "development = true\n[lease]\nstore = \"dynamodb\"\n[lease.dynamodb]\nregion = \"eu-west-1\"\nendpoint = \"{}\"\n",
            moto.endpoint
        ),
    )
    .unwrap();
    let config_path = config.path().to_str().unwrap();
    let out = idgen(&["leases", "--config", config_path, "--layout", "v2", "init"]).await.unwrap();
    assert!(out.contains("idgen-leases-v2"), "{out}");
    // A worker's claim of machine 170, through the store.
    let settings = idgen::DynamoDbSettings {
        region: "eu-west-1".into(),
        endpoint: Some(moto.endpoint.clone()),
        ..Default::default()
    };
    let store = idgen::DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, "idgen-leases-v2");
    use idgen::LeaseStore;
    let now = now_unix_ms();
    let token = idgen::ClaimToken::random();
    let holder = "i-0a1b2c3d4e5f67890/pid-4121/1";
    let idgen::ClaimOutcome::Claimed(row) = store.claim_as(170, holder, &token, now, now + 300_000).await.unwrap()
    else {
        panic!("claim")
    };

    // The playbook line, verbatim, pointed at the local endpoint.
    let run = |args: &'static str| aws_cli(&moto.endpoint, args);
    // 1. Who holds which machine number in a region right now
    let scan = run(r##"dynamodb scan --region eu-west-1 --table-name idgen-leases-v2 --projection-expression "machine_id, #h, lease_expiry, lease_epoch" --expression-attribute-names '{"#h": "holder"}'"##).await;
    // The scan shows the table's own records too (its genesis at machine_id -2, written by init):
    // the lease rows are the ones with a number 0 or above.
    let items = scan["Items"].as_array().unwrap();
    let leases: Vec<_> =
        items.iter().filter(|item| !item["machine_id"]["N"].as_str().unwrap().starts_with('-')).collect();
    assert_eq!(leases.len(), 1, "{scan}");
    assert_eq!(leases[0]["machine_id"]["N"], "170", "{scan}");
    assert_eq!(leases[0]["holder"]["S"], "i-0a1b2c3d4e5f67890/pid-4121/1", "{scan}");
    assert!(items.iter().any(|item| item["machine_id"]["N"] == "-2"), "the genesis record: {scan}");
    // 2. One machine number's lease
    let item = run(
        r##"dynamodb get-item --region eu-west-1 --table-name idgen-leases-v2 --key '{"machine_id": {"N": "170"}}'"##,
    )
    .await;
    assert_eq!(item["Item"]["lease_epoch"]["N"], row.lease_epoch.to_string(), "{item}");
    // 3. Quarantine machine number 170
    run(r##"dynamodb update-item --region eu-west-1 --table-name idgen-leases-v2 --key '{"machine_id": {"N": "170"}}' --update-expression "SET #h = :q, lease_expiry = :far ADD lease_epoch :one" --expression-attribute-names '{"#h": "holder"}' --expression-attribute-values '{":q": {"S": "QUARANTINED"}, ":far": {"N": "4102444800000"}, ":one": {"N": "1"}}'"##).await;
    let after = store.get(170).await.unwrap().unwrap();
    assert_eq!(
        (after.holder.as_str(), after.lease_expiry, after.lease_epoch),
        ("QUARANTINED", 4_102_444_800_000, row.lease_epoch + 1)
    );
    // Our own tools see the same row, and the old holder can no longer renew.
    let listed = idgen(&["leases", "--config", config_path, "--layout", "v2", "list"]).await.unwrap();
    assert!(listed.contains("quarantined"), "{listed}");
    let renewed =
        store.renew(170, "i-0a1b2c3d4e5f67890/pid-4121/1", row.lease_epoch, now + 600_000, now, now).await.unwrap();
    assert_eq!(renewed, idgen::Conditional::ConditionFailed);
    // The playbook's update leaves the claim token on the row; a retry of that claim (its answer
    // lost) must still not take the quarantined row for its own.
    let retried = store.claim_as(170, holder, &token, now, now + 300_000).await.unwrap();
    assert_eq!(retried, idgen::ClaimOutcome::Taken);
    // A quarantine that kept no expiry is lifted only once the operator says its holder is
    // stopped, and then holds the number for the longest lease.
    let lift = ["leases", "--config", config_path, "--layout", "v2", "--json", "release-quarantine", "170"];
    let refused = idgen(&lift).await.unwrap_err().to_string();
    assert!(refused.contains("kept no record") && refused.contains("--holder-stopped"), "{refused}");
    assert_eq!(store.get(170).await.unwrap(), Some(after), "a refused lift changes nothing");
    let lifted = idgen(&[&lift[..], &["--holder-stopped"]].concat()).await.unwrap();
    let lifted: serde_json::Value = serde_json::from_str(&lifted).unwrap();
    assert!(lifted["claimable_after_ms"].as_i64().unwrap() >= now + idgen::MAX_LEASE_MS, "{lifted}");
    println!("playbook: scan, get-item and the quarantine update-item ran verbatim against idgen-leases-v2");
}

// ---------------------------------------------------------------------------------------------
// A playbook quarantine, lifted from a clock an hour behind, with a live holder whose clock runs
// ahead: the successor must not issue a millisecond the holder may still issue.

/// The AWS CLI quarantine of runbooks/duplicate-id.md, as an operator copies it.
fn runbook_playbook_quarantine() -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../runbooks/duplicate-id.md")).unwrap();
    let line =
        page.lines().find(|line| line.starts_with("aws dynamodb update-item")).expect("the playbook's quarantine");
    line.to_owned()
}

/// The design notes' quarantine (R3.9, command 3): keeps no expiry.
const DESIGN_NOTES_QUARANTINE: &str = r##"aws dynamodb update-item --region eu-west-1 --table-name idgen-leases-v2 --key '{"machine_id": {"N": "170"}}' --update-expression "SET #h = :q, lease_expiry = :far ADD lease_epoch :one" --expression-attribute-names '{"#h": "holder"}' --expression-attribute-values '{":q": {"S": "QUARANTINED"}, ":far": {"N": "4102444800000"}, ":one": {"N": "1"}}'"##;

/// One holder of machine 170 with its clock 1.5 s ahead (libfaketime), frozen while it holds the
/// lease; the number quarantined with `quarantine` (AWS CLI lines, in order); lifted by
/// `idgen leases release-quarantine` with its clock an hour behind; a successor on time then
/// claims 170 while the holder, resumed, still issues inside its own lease.
struct HandOver {
    /// The holder's IDs under the lease it held when frozen (its epoch the same before and
    /// after each batch).
    cut_off: Vec<u64>,
    /// The holder's IDs once that lease was gone (it may claim 170 again, after the lift).
    holder_later: Vec<u64>,
    successor: Vec<u64>,
    lift: String,
    lifted: bool,
}

async fn lease_epoch(client: &reqwest::Client, worker: &WorkerProcess) -> Option<u64> {
    worker.health(client).await.ok().and_then(|(_, health)| health["leases"][0]["lease_epoch"].as_u64())
}

async fn quarantine_lift_and_hand_over(quarantine: &[&str], lift_args: &[&str]) -> HandOver {
    let client = client();
    let lib = std::env::var("IDGEN_FAKETIME_LIB")
        .expect("IDGEN_FAKETIME_LIB is not set (./scripts/test installs libfaketime)")
        .replace("libfaketime.so.1", "libfaketimeMT.so.1");
    // A server of its own, in the playbook's region. The worker issues v1 (before 2028), so the
    // command goes to v1's table, as an operator copying it would change it to.
    let moto = MotoServer::start().await.unwrap();
    let store = Store::Dynamodb { endpoint: moto.endpoint.clone(), table: "idgen-leases".into() };
    let spec = |name: &str| WorkerSpec {
        machines: (170, 170),
        dynamodb_region: Some("eu-west-1".into()),
        ..WorkerSpec::short_lease_on(name, store.clone())
    };
    let faked = |offset: &str| {
        vec![
            ("LD_PRELOAD".to_owned(), lib.clone()),
            ("FAKETIME".to_owned(), offset.to_owned()),
            ("DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ]
    };
    let holder = WorkerProcess::start(&WorkerSpec { env: faked("+1.5"), ..spec("ahead") }).await.unwrap();
    assert_eq!(holder.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 170);
    let epoch = lease_epoch(&client, &holder).await.expect("a lease");
    let mut cut_off = issue_ok(&client, &holder, 100).await;
    assert_eq!(lease_epoch(&client, &holder).await, Some(epoch));
    // Frozen inside its lease (a 3 s lease renewed every second: 2 s or more of it left).
    holder.freeze().await.unwrap();

    for command in quarantine {
        // The line as written, pointed at the local endpoint.
        let command = command.replace("--table-name idgen-leases-v2 ", "--table-name idgen-leases ");
        aws_cli(&moto.endpoint, command.trim_start_matches("aws ")).await;
    }

    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec("operator").toml()).unwrap();
    let mut args = vec!["leases", "--config", config.path().to_str().unwrap(), "--json", "release-quarantine", "170"];
    args.extend(lift_args);
    let lift =
        tokio::process::Command::new(idgen_e2e::idgen_bin()).args(&args).envs(faked("-3600")).output().await.unwrap();
    let lifted = lift.status.success();
    let lift_output = format!("{}{}", String::from_utf8_lossy(&lift.stdout), String::from_utf8_lossy(&lift.stderr));

    // The successor, on time, asks for 170 at once; the holder wakes up still inside its lease.
    let successor = WorkerProcess::start(&spec("successor")).await.unwrap();
    holder.signal(libc::SIGCONT);
    let (mut holder_later, mut after) = (Vec::new(), Vec::new());
    let mut still_cut_off = true;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let before = lease_epoch(&client, &holder).await;
        if let Ok(Issued::Ids(batch)) = post_ids(&client, &holder.url, 50).await {
            // Under the first lease if it held it before and nothing newer after (no lease at
            // all once it lost it: the batch came from before).
            let after = lease_epoch(&client, &holder).await;
            let first = still_cut_off && before == Some(epoch) && after.is_none_or(|e| e == epoch);
            if first {
                cut_off.extend(batch)
            } else {
                holder_later.extend(batch)
            }
            still_cut_off &= after == Some(epoch);
        }
        if let Ok(Issued::Ids(batch)) = post_ids(&client, &successor.url, 50).await {
            after.extend(batch);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.stop().await.unwrap();
    successor.stop().await.unwrap();
    HandOver { cut_off, holder_later, successor: after, lift: lift_output, lifted }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_playbook_quarantine_and_a_lift_from_a_clock_an_hour_behind_issue_no_id_twice() {
    // The runbook's command keeps the holder's own expiry: the lift holds the number until then,
    // whatever the operator's clock says.
    let run = quarantine_lift_and_hand_over(&[&runbook_playbook_quarantine()], &[]).await;
    assert!(run.lifted, "{}", run.lift);
    let claimable_after =
        serde_json::from_str::<serde_json::Value>(&run.lift).unwrap()["claimable_after_ms"].as_i64().unwrap();
    let last_cut_off = run.cut_off.iter().map(|id| v1_fields(*id).0).max().unwrap();
    assert!(
        claimable_after > last_cut_off,
        "lifted to {claimable_after}, the cut-off holder issued up to {last_cut_off}"
    );
    // Whoever holds 170 after the lift (the successor, or the holder again) starts above it.
    let first_after =
        run.successor.iter().chain(&run.holder_later).map(|id| v1_fields(*id).0).min().expect("170 changed hands");
    assert!(
        first_after > last_cut_off,
        "170 was issued under from {first_after}, at or below the cut-off holder's last millisecond {last_cut_off}"
    );
    let mut all = [run.cut_off.clone(), run.holder_later.clone(), run.successor.clone()].concat();
    let checked = assert_no_duplicates(&mut all);
    println!(
        "playbook lift: {checked} IDs; the cut-off holder (1.5 s ahead) issued up to {last_cut_off}, the lift (an hour \
         behind) held 170 until {claimable_after}, and it was issued under again from {first_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_playbook_quarantine_that_kept_no_expiry_is_not_lifted_without_holder_stopped() {
    // The design notes' command keeps nothing (and the runbook's, run after it, can keep only the
    // quarantine's own expiry): the lift is refused and the number stays quarantined, so the
    // holder ahead finishes its lease alone.
    let commands = [DESIGN_NOTES_QUARANTINE, &runbook_playbook_quarantine()];
    let run = quarantine_lift_and_hand_over(&commands, &[]).await;
    assert!(!run.lifted && run.lift.contains("--holder-stopped"), "{}", run.lift);
    assert!(run.successor.is_empty() && run.holder_later.is_empty(), "170 was issued under while still quarantined");
    let mut all = run.cut_off.clone();
    let checked = assert_no_duplicates(&mut all);
    println!("playbook without a kept expiry: lift refused; {checked} IDs by the cut-off holder alone");
}

// ---------------------------------------------------------------------------------------------
// Production mode follows the kernel's NTP state.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_production_mode_follows_the_kernel_clock_state() {
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    let spec = WorkerSpec::short_lease("production", &dir.path().join("leases.db"));
    let toml = spec.toml().replace("require_sync = false", "require_sync = true");
    let config = dir.path().join("worker.toml");
    std::fs::write(&config, toml).unwrap();
    let mut child = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["worker", "--config", config.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = lines.next_line().await.unwrap().unwrap();
    let url = line.split_whitespace().nth(3).unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let kernel = idgen::clock::kernel_sync_status(5_000);
    let health: serde_json::Value = client.get(format!("{url}/healthz")).send().await.unwrap().json().await.unwrap();
    let issued = client.post(format!("{url}/v1/ids")).send().await.unwrap();
    match kernel {
        idgen::SyncStatus::Unsynchronized(reason) => {
            assert_eq!(health["reason"], "clock_unsynchronized", "{health}");
            assert_eq!(health["clock"]["synchronized"], false);
            assert!(health["leases"].as_array().unwrap().is_empty(), "no claim with an unsynchronized clock: {health}");
            assert_eq!(issued.status(), 503);
            let body: serde_json::Value = issued.json().await.unwrap();
            assert_eq!(body["error"]["code"], "clock_unsynchronized");
            println!("clock sync: kernel says unsynchronized ({reason}); the worker refuses: {health}");
        }
        other => {
            assert_eq!(health["clock"]["synchronized"], true, "{health}");
            assert_eq!(issued.status(), 200);
            println!("clock sync: kernel says {other:?}; the worker issues");
        }
    }
    child.kill().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The audit table is killed mid-run: the records wait in the spool on disk, survive a kill -9,
// and are all in the table once it is back.

/// The value of one series on `/metrics` (0 when it is not there).
async fn series(client: &reqwest::Client, worker: &WorkerProcess, name: &str) -> u64 {
    let text = worker.metrics(client).await.unwrap();
    text.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_audit_table_killed_mid_run_every_record_is_found_afterwards() {
    let client = client();
    let store = dynamodb("audit");
    let Store::Dynamodb { table, endpoint } = &store else { unreachable!() };
    let audit = format!("{table}-audit");
    let spool = tempfile::tempdir().unwrap();
    let spec =
        WorkerSpec { audit_spool: Some(spool.path().into()), ..WorkerSpec::short_lease_on("audited", store.clone()) };
    let worker = WorkerProcess::start(&spec).await.unwrap();
    let first = worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let mut ids = issue_ok(&client, &worker, 200).await;

    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
    let dynamodb = idgen::lease::dynamodb::client(&settings).await;
    dynamodb.delete_table().table_name(&audit).send().await.unwrap();

    // The operator quarantines the worker's number: the change applies, its record is spooled.
    // (The operator's configuration does not create missing tables, as in production.)
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml().replace("create_tables = true\n", "")).unwrap();
    let config_path = config.path().to_str().unwrap();
    let quarantine = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["leases", "--config", config_path, "quarantine", &first.to_string(), "--operator", "oncall"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&quarantine.stderr);
    assert!(quarantine.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&quarantine.stdout);
    assert!(stdout.contains("quarantined"), "{stdout}\n{stderr}");
    assert!(stderr.contains("audit record(s) for") && stderr.contains(&spool.path().display().to_string()), "{stderr}");

    // The worker's renewal fails (renew_failed) and it claims another number (claim): both spooled.
    let second = wait_issuing_under_another_number(&client, &worker, first, Duration::from_secs(15)).await;
    ids.extend(issue_ok(&client, &worker, 200).await);
    let waiting = format!("idgen_audit_records_waiting{{table=\"{audit}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while series(&client, &worker, &waiting).await < 2 {
        assert!(Instant::now() < deadline, "the worker's records never showed as waiting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // kill -9: now only the spool files hold those records.
    let mut worker = worker;
    worker.signal(libc::SIGKILL);
    worker.child.wait().await.unwrap();
    let files = std::fs::read_dir(spool.path()).unwrap().count();
    assert!(files >= 2, "the worker's and the CLI's spool files: {files}");

    // The table comes back; a new worker using the same spool directory writes everything.
    idgen(&["leases", "--config", config_path, "init"]).await.unwrap();
    let heir = WorkerProcess::start(&WorkerSpec { name: "heir".into(), ..spec.clone() }).await.unwrap();
    heir.wait_ready(&client, Duration::from_secs(15)).await.unwrap();
    let replayed = format!("idgen_audit_records_replayed_total{{table=\"{audit}\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while series(&client, &heir, &replayed).await < 3 || std::fs::read_dir(spool.path()).unwrap().count() > 0 {
        assert!(Instant::now() < deadline, "spooled records not replayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(series(&client, &heir, &waiting).await, 0);

    let events = |machine: u32| {
        let config_path = config_path.to_owned();
        async move {
            let out =
                idgen(&["leases", "--config", &config_path, "--json", "history", &machine.to_string()]).await.unwrap();
            serde_json::from_str::<serde_json::Value>(&out)
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let of_first = events(first).await;
    let of_second = events(second).await;
    assert!(
        of_first.contains(&"quarantine".to_owned()) && of_first.contains(&"renew_failed".to_owned()),
        "{of_first:?}"
    );
    assert!(of_second.contains(&"claim".to_owned()), "{of_second:?}");
    ids.extend(issue_ok(&client, &heir, 200).await);
    let checked = assert_no_duplicates(&mut ids);
    println!(
        "audit table killed: machine {first}: {of_first:?}, machine {second}: {of_second:?}, all written after a kill -9; {checked} IDs, no duplicates"
    );
    heir.stop().await.unwrap();
}

// A restored lease table (DynamoDB restores into a new table) holds the expiries of its restore
// point, while the holders since then issue under the live table.

/// The arguments that put an [`aws_cli`] line in the development region the workers' tables are
/// in (us-east-1), with JSON output.
const DEV_REGION_ARGS: &str = "--region us-east-1 --output json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_restored_lease_table_is_claimed_in_only_once_adopted_and_no_id_is_issued_twice() {
    let client = client();
    let endpoint = shared_dynamodb_endpoint();
    let table = unique_table("restore");
    let copy = format!("{table}-restored");
    // A holds the range's one number, 0, in the live table.
    let mut spec_a =
        WorkerSpec::short_lease_on("a", Store::Dynamodb { endpoint: endpoint.clone(), table: table.clone() });
    spec_a.machines = (0, 0);
    let a = WorkerProcess::start(&spec_a).await.unwrap();
    assert_eq!(a.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 0);
    // A backup now. By the time it is restored A has renewed well past the expiry it holds.
    let backup = aws_cli(
        &endpoint,
        &format!("dynamodb create-backup {DEV_REGION_ARGS} --table-name {table} --backup-name before"),
    )
    .await;
    let backup_arn = backup["BackupDetails"]["BackupArn"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let restored = aws_cli(
        &endpoint,
        &format!(
            "dynamodb restore-table-from-backup {DEV_REGION_ARGS} --target-table-name {copy} --backup-arn {backup_arn}"
        ),
    )
    .await;
    assert!(restored["TableDescription"]["RestoreSummary"].is_object(), "{restored}");

    // B, on the copy, with the same one number: its row there expired seconds ago.
    let mut spec_b =
        WorkerSpec::short_lease_on("b", Store::Dynamodb { endpoint: endpoint.clone(), table: copy.clone() });
    spec_b.machines = (0, 0);
    match worker_exit(&spec_b).await {
        Some((status, stderr)) => {
            assert!(!status.success(), "{stderr}");
            assert!(stderr.contains("restored copy") && stderr.contains("idgen leases adopt"), "{stderr}");
        }
        None => {
            // It ran: as before, it claimed machine 0 in the copy while A issues under it.
            let b = WorkerProcess::start(&spec_b).await.unwrap();
            b.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
            let mut ids = Vec::new();
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                let (x, y) = tokio::join!(post_ids(&client, &a.url, 200), post_ids(&client, &b.url, 200));
                for issued in [x.unwrap(), y.unwrap()] {
                    if let Issued::Ids(more) = issued {
                        ids.extend(more);
                    }
                }
            }
            assert_no_duplicates(&mut ids);
            panic!(
                "a worker started on a restored lease table nobody adopted and issued under its live holder's number"
            );
        }
    }

    // A keeps issuing until the adoption cuts it off; every ID it issues is collected.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let (client, url, stop) = (client.clone(), a.url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(Issued::Ids(more)) = post_ids(&client, &url, 50).await {
                    ids.extend(more);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            ids
        })
    };
    let config_b = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config_b.path(), spec_b.toml()).unwrap();
    let config_b = config_b.path().to_str().unwrap();
    let adopted =
        idgen(&["leases", "--config", config_b, "adopt", "--from-table", &table, "--operator", "test"]).await.unwrap();
    assert!(adopted.contains("quarantined all 1024 numbers of layout v1") && adopted.contains("adopted"), "{adopted}");
    wait_refusing_without_lease(&client, &a, Duration::from_secs(5)).await;

    let b = WorkerProcess::start(&spec_b).await.unwrap();
    assert_eq!(b.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 0);
    let mut from_b = Vec::new();
    for _ in 0..20 {
        from_b.extend(issue_ok(&client, &b, 50).await);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let from_a = hammer.await.unwrap();
    assert!(!from_a.is_empty());
    let last_a = from_a.iter().map(|&id| v1_fields(id).0).max().unwrap();
    let first_b = from_b.iter().map(|&id| v1_fields(id).0).min().unwrap();
    assert!(last_a < first_b, "A issued under machine 0 until {last_a}, B from {first_b}");
    let mut all: Vec<u64> = from_a.iter().chain(&from_b).copied().collect();
    let checked = assert_no_duplicates(&mut all);
    // The table's own record of the adoption is no machine number's row.
    let listed = idgen(&["leases", "--config", config_b, "--json", "list"]).await.unwrap();
    let rows: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert!(rows.as_array().unwrap().iter().all(|row| row["machine_id"].as_i64().unwrap() >= 0), "{rows}");

    // A second copy of a source that is gone: adopted after waiting out a lease.
    let gone = format!("{table}-gone");
    aws_cli(
        &endpoint,
        &format!(
            "dynamodb restore-table-from-backup {DEV_REGION_ARGS} --target-table-name {gone} --backup-arn {backup_arn}"
        ),
    )
    .await;
    let mut spec_c = WorkerSpec::short_lease_on("c", Store::Dynamodb { endpoint: endpoint.clone(), table: gone });
    spec_c.machines = (0, 0);
    let (status, stderr) = worker_exit(&spec_c).await.expect("refused");
    assert!(!status.success() && stderr.contains("restored copy"), "{stderr}");
    let config_c = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config_c.path(), spec_c.toml()).unwrap();
    let config_c_path = config_c.path().to_str().unwrap();
    // Not gone while its source still exists: its holders may renew there.
    let refused = idgen(&["leases", "--config", config_c_path, "adopt", "--source-gone"]).await.unwrap_err();
    assert!(format!("{refused:#}").contains("still exists") && format!("{refused:#}").contains("--from-table"));
    // Gone: the wait is the longest lease any holder may have (one hour) unless the operator knows
    // every holder's, as here (the workers' 3 s).
    aws_cli(&endpoint, &format!("dynamodb delete-table {DEV_REGION_ARGS} --table-name {table}")).await;
    let adopted =
        idgen(&["leases", "--config", config_c_path, "adopt", "--source-gone", "--lease-ms", "3000"]).await.unwrap();
    assert!(adopted.contains("adopted"), "{adopted}");
    let c = WorkerProcess::start(&spec_c).await.unwrap();
    c.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    println!("restore: {checked} IDs, A's last at {last_a}, B's first at {first_b}");
    for worker in [a, b, c] {
        worker.stop().await.unwrap();
    }
}

// A fresh lease table beside the live one: nothing on it says which holders are issuing under its
// numbers elsewhere, so nobody may claim in it before an operator made it the fleet's table.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_worker_on_a_fresh_table_beside_the_live_one_issues_nothing() {
    let client = client();
    let endpoint = shared_dynamodb_endpoint();
    let (live, fresh) = (unique_table("live"), unique_table("fresh"));
    // A holds the range's one number, 0, in the live table.
    let mut spec_a = WorkerSpec::short_lease_on("a", Store::Dynamodb { endpoint: endpoint.clone(), table: live });
    spec_a.machines = (0, 0);
    let a = WorkerProcess::start(&spec_a).await.unwrap();
    assert_eq!(a.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 0);
    // The new table is made beside it (by a stack, a script, DynamoDB's import), as bare tables.
    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
    let client_b = idgen::lease::dynamodb::client(&settings).await;
    idgen::DynamoDbLeaseStore::new(client_b, &fresh).create_tables().await.unwrap();
    // B, on it, with the same one number; its configuration creates nothing (as in production).
    let mut spec_b = WorkerSpec::short_lease_on("b", Store::Dynamodb { endpoint, table: fresh });
    (spec_b.machines, spec_b.create_tables) = ((0, 0), false);
    match worker_exit(&spec_b).await {
        Some((status, stderr)) => {
            assert!(!status.success(), "{stderr}");
            assert!(stderr.contains("genesis") && stderr.contains("idgen leases init"), "{stderr}");
        }
        None => {
            // It ran: it claimed machine 0 in the fresh table while A issues under it.
            let b = WorkerProcess::start(&spec_b).await.unwrap();
            b.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
            let (mut ids, mut from_b) = (Vec::new(), 0);
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                let (x, y) = tokio::join!(post_ids(&client, &a.url, 200), post_ids(&client, &b.url, 200));
                if let Issued::Ids(more) = x.unwrap() {
                    ids.extend(more);
                }
                if let Issued::Ids(more) = y.unwrap() {
                    from_b += more.len();
                    ids.extend(more);
                }
            }
            let all = ids.len();
            ids.sort_unstable();
            ids.dedup();
            panic!(
                "a worker on a fresh table nobody made the fleet's issued {from_b} IDs under the live holder's number; \
                 {} of {all} were the same",
                all - ids.len()
            );
        }
    }
    a.stop().await.unwrap();
}

// An upgrade: a live table of an earlier release has rows and no genesis. A worker of this release
// refuses to start on it and names `init`; `init` records the genesis and changes no row; the
// worker then starts, and leaves the live holder's number alone.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_live_table_of_an_earlier_release_is_initialized_in_place_and_keeps_its_rows() {
    use idgen::LeaseStore;
    let client = client();
    let endpoint = shared_dynamodb_endpoint();
    let table = unique_table("upgraded");
    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
    let store = idgen::DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, &table);
    store.create_tables().await.unwrap();
    // Machine 0 held by a live generator of the earlier release; machine 1 released long ago.
    let now = now_unix_ms();
    store.claim(0, "earlier/pid-1/1", now, now + 60_000).await.unwrap();
    store.claim(1, "earlier/pid-2/1", now - 600_000, now - 500_000).await.unwrap();
    let before = store.list().await.unwrap();

    let mut spec = WorkerSpec::short_lease_on("upgraded", Store::Dynamodb { endpoint, table: table.clone() });
    (spec.machines, spec.create_tables) = ((0, 1), false);
    let (status, stderr) = worker_exit(&spec).await.expect("a worker on a table without a genesis does not start");
    assert!(!status.success() && stderr.contains("idgen leases init"), "{stderr}");

    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();
    let out = idgen(&["leases", "--config", config.path().to_str().unwrap(), "--layout", "v1", "init"]).await.unwrap();
    assert!(out.contains("genesis") && out.contains("its 2 rows are as they were"), "{out}");
    assert_eq!(store.list().await.unwrap(), before, "init changed a row");
    assert!(store.genesis().await.unwrap().is_some());

    let worker = WorkerProcess::start(&spec).await.unwrap();
    assert_eq!(worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 1, "machine 0 is held");
    assert!(worker.stop().await.unwrap().success());
}

/// `idgen <args>` run to its exit: its status, standard output and standard error.
async fn idgen_output(args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(idgen_e2e::idgen_bin()).args(args).output().await.unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_with_a_registry_a_region_claims_only_in_the_table_it_names_and_a_move_goes_with_an_adoption() {
    let client = client();
    let endpoint = shared_dynamodb_endpoint();
    let dir = tempfile::tempdir().unwrap();
    let (live, fresh) = (unique_table("named"), unique_table("beside"));
    let registry = idgen_e2e::RegistryProcess::start("").await.unwrap();
    // The registry names the region's tables: the live one (and its v2 pair, as WorkerSpec names it).
    let live_v2 = format!("{live}-v2");
    registry.add_region_with_tables(&client, "us-east-1", &[("v1", &live), ("v2", &live_v2)]).await.unwrap();
    let on = |name: &str, table: &str| {
        let mut spec =
            WorkerSpec::short_lease_on(name, Store::Dynamodb { endpoint: endpoint.clone(), table: table.into() });
        spec.machines = (0, 0);
        spec.extra = format!(
            "region = \"us-east-1\"\nregistry_url = \"{}\"\nschedule_cache = \"{}\"\n",
            registry.url,
            dir.path().join(format!("{name}-schedule.json")).display()
        );
        spec
    };
    let spec_a = on("a", &live);
    let a = WorkerProcess::start(&spec_a).await.unwrap();
    assert_eq!(a.wait_ready(&client, Duration::from_secs(10)).await.unwrap(), 0);

    // A table beside it, made the fleet's as far as its own record goes (`init` by a
    // configuration without the registry): still not the region's.
    let mut spec_b = on("b", &fresh);
    spec_b.create_tables = false;
    let no_registry = WorkerSpec { extra: String::new(), ..spec_b.clone() };
    let config_plain = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config_plain.path(), no_registry.toml()).unwrap();
    idgen(&["leases", "--config", config_plain.path().to_str().unwrap(), "--layout", "v1", "init"]).await.unwrap();
    let config_b = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config_b.path(), spec_b.toml()).unwrap();
    let config_b = config_b.path().to_str().unwrap();
    // `init` with the region's configuration refuses a table the registry does not name.
    let (ok, _, stderr) = idgen_output(&["leases", "--config", config_b, "--layout", "v1", "init"]).await;
    assert!(!ok && stderr.contains(&format!("the registry names {live}")), "{stderr}");
    // And so does a worker: it does not start.
    let (status, stderr) = worker_exit(&spec_b).await.expect("refused at its start");
    assert!(!status.success() && stderr.contains(&format!("the registry names {live}")), "{stderr}");
    assert!(stderr.contains("move-lease-table"), "{stderr}");

    // The move: adopted from the live table (every number quarantined there, expiries carried),
    // then the registry moved; only then does B claim, and after A's last ID.
    let hammer = hammer(&client, &a);
    let (ok, adopted, stderr) =
        idgen_output(&["leases", "--config", config_b, "--layout", "v1", "adopt", "--from-table", &live]).await;
    assert!(ok, "{stderr}");
    let command = format!("move-lease-table us-east-1 --confirm us-east-1 --layout v1 --from {live} --to {fresh}");
    assert!(adopted.contains(&command), "the adoption names the registry's step: {adopted}");
    let (status, stderr) = worker_exit(&spec_b).await.expect("refused until the registry moves");
    assert!(!status.success() && stderr.contains(&format!("the registry names {live}")), "{stderr}");
    let moved = idgen(&[
        "regions",
        "--registry",
        &registry.url,
        "--token",
        &registry.token,
        "move-lease-table",
        "us-east-1",
        "--confirm",
        "us-east-1",
        "--layout",
        "v1",
        "--from",
        &live,
        "--to",
        &fresh,
    ])
    .await
    .unwrap();
    assert!(moved.contains(&format!("v1 {fresh} (moved from {live})")), "{moved}");
    let b = WorkerProcess::start(&spec_b).await.unwrap();
    assert_eq!(b.wait_ready(&client, Duration::from_secs(15)).await.unwrap(), 0);
    let mut from_b = Vec::new();
    for _ in 0..10 {
        from_b.extend(issue_ok(&client, &b, 50).await);
    }
    let from_a = hammer.stop().await;
    assert!(!from_a.is_empty());
    let last_a = from_a.iter().map(|&id| v1_fields(id).0).max().unwrap();
    let first_b = from_b.iter().map(|&id| v1_fields(id).0).min().unwrap();
    assert!(last_a < first_b, "A issued under machine 0 until {last_a}, B from {first_b}");
    let mut all: Vec<u64> = from_a.iter().chain(&from_b).copied().collect();
    let checked = assert_no_duplicates(&mut all);
    println!("registry-named tables: a fresh table refused until adopted and moved; {checked} IDs, none twice");
    for worker in [a, b] {
        worker.stop().await.unwrap();
    }
}

/// A client issuing from one worker until stopped, collecting every ID.
struct Hammer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<u64>>,
}

impl Hammer {
    async fn stop(self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

fn hammer(client: &reqwest::Client, worker: &WorkerProcess) -> Hammer {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (client, url, flag) = (client.clone(), worker.url.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut ids = Vec::new();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if let Ok(Issued::Ids(more)) = post_ids(&client, &url, 50).await {
                ids.extend(more);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ids
    });
    Hammer { stop, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_an_adoption_carries_each_quarantine_as_it_was_kept_and_refuses_a_copy_of_another_table() {
    let endpoint = shared_dynamodb_endpoint();
    let (old, other, new) = (unique_table("quarantined"), unique_table("other"), unique_table("adopting"));
    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
    let dynamodb = idgen::lease::dynamodb::client(&settings).await;
    for table in [&old, &other] {
        idgen::DynamoDbLeaseStore::new(dynamodb.clone(), table).create_tables().await.unwrap();
    }
    let old_store = idgen::DynamoDbLeaseStore::new(dynamodb.clone(), &old);
    let now = now_unix_ms();
    use idgen::LeaseStore as _;
    old_store.claim(3, "h3", now, now + 60_000).await.unwrap();
    old_store.claim(4, "h4", now, now + 60_000).await.unwrap();
    // A backup while both are held, as the copy to adopt will be.
    let backup = aws_cli(
        &endpoint,
        &format!("dynamodb create-backup {DEV_REGION_ARGS} --table-name {old} --backup-name before"),
    )
    .await;
    let arn = backup["BackupDetails"]["BackupArn"].as_str().unwrap().to_owned();
    // Both renew to an hour ahead; then machine 3 is quarantined by the design notes' command
    // (nothing kept: its holder's expiry is known nowhere), machine 4 by ours (the expiry kept).
    old_store.renew(3, "h3", 1, now + 3_600_000, now, now).await.unwrap();
    old_store.renew(4, "h4", 1, now + 3_600_000, now, now).await.unwrap();
    aws_cli(
        &endpoint,
        &format!(
            "dynamodb update-item {DEV_REGION_ARGS} --table-name {old} --key '{{\"machine_id\": {{\"N\": \"3\"}}}}' \
             --update-expression 'SET #h = :q, lease_expiry = :far ADD lease_epoch :one' \
             --expression-attribute-names '{{\"#h\": \"holder\"}}' \
             --expression-attribute-values '{{\":q\": {{\"S\": \"QUARANTINED\"}}, \":far\": {{\"N\": \"4102444800000\"}}, \":one\": {{\"N\": \"1\"}}}}'"
        ),
    )
    .await;
    old_store.quarantine(4, "oncall", now).await.unwrap();

    // The copy holds both as held, with the expiry of the backup's time.
    aws_cli(
        &endpoint,
        &format!("dynamodb restore-table-from-backup {DEV_REGION_ARGS} --target-table-name {new} --backup-arn {arn}"),
    )
    .await;
    idgen::DynamoDbLeaseStore::new(dynamodb.clone(), &new).create_tables().await.unwrap(); // its audit table
    let mut spec =
        WorkerSpec::short_lease_on("adopter", Store::Dynamodb { endpoint: endpoint.clone(), table: new.clone() });
    spec.create_tables = false;
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();
    let config = config.path().to_str().unwrap();
    let (ok, _, stderr) =
        idgen_output(&["leases", "--config", config, "--layout", "v1", "adopt", "--from-table", &other]).await;
    assert!(!ok && stderr.contains(&format!("a restored copy of {old}, not of {other}")), "{stderr}");
    let untouched = idgen::DynamoDbLeaseStore::new(dynamodb.clone(), &other);
    assert!(untouched.list().await.unwrap().is_empty(), "the other table was not quarantined");

    // Adopted from its source: machine 3's quarantine still kept nothing, 4's kept its expiry.
    let (ok, _, stderr) =
        idgen_output(&["leases", "--config", config, "--layout", "v1", "adopt", "--from-table", &old]).await;
    assert!(ok, "{stderr}");
    let adopted = idgen::DynamoDbLeaseStore::new(dynamodb, &new);
    let three = adopted.get(3).await.unwrap().unwrap();
    assert_eq!((three.holder.as_str(), three.expiry_before_quarantine), ("QUARANTINED", None), "{three:?}");
    let four = adopted.get(4).await.unwrap().unwrap();
    assert_eq!(four.expiry_before_quarantine, Some(now + 3_600_000), "{four:?}");
    // So lifting 3 there still needs its holder stopped; 4 lifts as before.
    let (ok, _, stderr) =
        idgen_output(&["leases", "--config", config, "--layout", "v1", "release-quarantine", "3"]).await;
    assert!(!ok && stderr.contains("--holder-stopped"), "lifted without the holder stopped: {stderr}");
    let (ok, _, stderr) =
        idgen_output(&["leases", "--config", config, "--layout", "v1", "release-quarantine", "4"]).await;
    assert!(ok, "{stderr}");
    let (ok, _, stderr) =
        idgen_output(&["leases", "--config", config, "--layout", "v1", "release-quarantine", "3", "--holder-stopped"])
            .await;
    assert!(ok, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_an_adoption_by_an_operator_whose_clock_runs_ahead_carries_every_kept_expiry() {
    // `adopt --from-table` carried only the kept expiries later than the operator's
    // clock (capped at its now + the longest lease): an operator host twenty minutes ahead skipped
    // a live holder's expiry, and a claim in the new table took the number while it issued.
    let endpoint = shared_dynamodb_endpoint();
    let (old, new) = (unique_table("ahead-old"), unique_table("ahead-new"));
    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
    let dynamodb = idgen::lease::dynamodb::client(&settings).await;
    for table in [&old, &new] {
        idgen::DynamoDbLeaseStore::new(dynamodb.clone(), table).create_tables().await.unwrap();
    }
    use idgen::LeaseStore as _;
    let old_store = idgen::DynamoDbLeaseStore::new(dynamodb.clone(), &old);
    let now = now_unix_ms();
    old_store.claim(5, "holder", now, now + 900_000).await.unwrap();
    let mut spec =
        WorkerSpec::short_lease_on("adopter", Store::Dynamodb { endpoint: endpoint.clone(), table: new.clone() });
    spec.create_tables = false;
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();
    let lib = std::env::var("IDGEN_FAKETIME_LIB")
        .expect("IDGEN_FAKETIME_LIB is not set (./scripts/test installs libfaketime)");
    let adopted = tokio::process::Command::new(idgen_e2e::idgen_bin())
        .args(["leases", "--config", config.path().to_str().unwrap(), "--layout", "v1", "adopt", "--from-table", &old])
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", "+20m")
        .env("DONT_FAKE_MONOTONIC", "1")
        .output()
        .await
        .unwrap();
    assert!(adopted.status.success(), "{}", String::from_utf8_lossy(&adopted.stderr));
    let new_store = idgen::DynamoDbLeaseStore::new(dynamodb, &new);
    let carried = new_store.get(5).await.unwrap().expect("the holder's expiry was carried");
    assert_eq!(carried.lease_expiry, now + 900_000, "carried as it was kept: {carried:?}");
    // Nobody claims it in the new table before the holder's expiry, by any honest clock.
    let claim = new_store.claim(5, "successor", now_unix_ms(), now_unix_ms() + 3_000).await.unwrap();
    assert_eq!(claim, idgen::ClaimOutcome::Taken);
}
