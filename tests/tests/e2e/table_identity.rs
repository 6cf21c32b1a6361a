//! Never twice, fifth round, through the real binaries: a lease table is known by its genesis,
//! not its name (a second host's SQLite file for a region, a DynamoDB table of the same name in
//! another AWS region: their workers issue nothing); a registry started over under a live region
//! never hands that region's number to a new one; a SQLite lease file replaced under a worker
//! stops it at its next renewal, and what the replacement says is safe to follow.

use std::path::Path;
use std::time::{Duration, Instant};

use idgen_e2e::{
    RegistryProcess, Store, WorkerProcess, WorkerSpec, idgen_bin, shared_dynamodb_endpoint, unique_table, worker_exit,
};
use serde_json::Value;

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// `idgen leases --config CONFIG --layout v1 init` with the operator token: its exit status,
/// standard output and error.
async fn leases_init(config: &Path, token: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(idgen_bin())
        .args(["leases", "--config", config.to_str().unwrap(), "--layout", "v1", "init", "--json"])
        .env("IDGEN_OPERATOR_TOKEN", token)
        .output()
        .await
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

async fn health(client: &reqwest::Client, url: &str) -> Value {
    client.get(format!("{url}/healthz")).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_second_hosts_sqlite_file_for_a_region_issues_nothing() {
    // `idgen up` runs us-east-1; a second host of the region gets a SQLite file of
    // its own. Before, `leases init` took it (exit 0) and its worker, limited to the number up's
    // worker-1 holds, issued 30,400 IDs twice in 10 s.
    let dir = tempfile::tempdir().unwrap();
    let (mut up, port) = idgen_e2e::start_up(dir.path(), &[]).await;
    let client = client();
    let worker_1 = format!("http://127.0.0.1:{}", port + 1);
    let held = health(&client, &worker_1).await;
    let machine = held["leases"][0]["machine"].as_u64().expect("worker-1 holds a lease");
    let token = std::fs::read_to_string(dir.path().join(".idgen/operator-token")).unwrap();

    // The region's table as `up` recorded it: its genesis, in the registry.
    let regions: Value =
        client.get(format!("http://127.0.0.1:{port}/v1/regions")).send().await.unwrap().json().await.unwrap();
    let recorded = regions["regions"][0]["lease_tables"]["v1"]["table_id"].as_str().expect("up recorded it").to_owned();

    let host = tempfile::tempdir().unwrap();
    let mut spec = WorkerSpec::short_lease("second-host", &host.path().join("leases.db"));
    spec.machines = (machine as u32, machine as u32);
    spec.extra = format!(
        "region = \"us-east-1\"\nregistry_url = \"http://127.0.0.1:{port}\"\nschedule_cache = \"{}\"\n",
        host.path().join("schedule.json").display()
    );
    spec.create_tables = false;
    let config = host.path().join("worker.toml");
    std::fs::write(&config, spec.toml()).unwrap();
    let (ok, stdout, stderr) = leases_init(&config, token.trim()).await;
    assert!(!ok, "init took a second table of the region: {stdout}");
    assert!(stderr.contains("another table of the same name") && stderr.contains(&recorded), "{stderr}");

    // Its worker, the genesis written all the same, is refused: it never issues.
    let (status, stderr) = worker_exit(&spec).await.expect("a worker on the second table does not start");
    assert!(!status.success() && stderr.contains("another table of the same name"), "{stderr}");
    // A development generator that writes its own genesis (create_tables) is refused the same.
    spec.create_tables = true;
    let (status, stderr) = worker_exit(&spec).await.expect("refused with create_tables too");
    assert!(!status.success() && stderr.contains(&recorded), "{stderr}");
    // up's worker-1 issues on.
    let after = health(&client, &worker_1).await;
    assert_eq!(after["leases"][0]["machine"].as_u64(), Some(machine), "{after}");
    let _ = up.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_dynamodb_table_of_the_same_name_in_another_aws_region_issues_nothing() {
    // A second regional stack under the same region name in another AWS region runs
    // `leases init` on its table of the same name with the same registry.
    let client = client();
    let registry = RegistryProcess::start("").await.unwrap();
    let table = unique_table("same-name");
    assert_eq!(registry.add_region_with_tables(&client, "us-east-1", &[("v1", &table)]).await.unwrap(), 0);
    let dir = tempfile::tempdir().unwrap();
    let spec_in = |aws_region: &str| {
        let store = Store::Dynamodb { endpoint: shared_dynamodb_endpoint(), table: table.clone() };
        let mut spec = WorkerSpec::short_lease_on(&format!("in-{aws_region}"), store);
        spec.dynamodb_region = Some(aws_region.to_owned());
        spec.create_tables = false;
        spec.machines = (0, 1);
        spec.extra = format!(
            "region = \"us-east-1\"\nregistry_url = \"{}\"\nschedule_cache = \"{}\"\n",
            registry.url,
            dir.path().join(format!("schedule-{aws_region}.json")).display()
        );
        spec
    };
    let (first, second) = (spec_in("us-east-1"), spec_in("eu-west-1"));
    for (spec, name) in [(&first, "first.toml"), (&second, "second.toml")] {
        std::fs::write(dir.path().join(name), spec.toml()).unwrap();
    }
    let (ok, stdout, stderr) = leases_init(&dir.path().join("first.toml"), &registry.token).await;
    assert!(ok, "{stderr}");
    let initialized: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(initialized["identity_recorded"], true, "{initialized}");
    let genesis = initialized["genesis"]["table_id"].as_str().unwrap().to_owned();
    // Again: idempotent, nothing more recorded.
    let (ok, stdout, _) = leases_init(&dir.path().join("first.toml"), &registry.token).await;
    assert!(ok && stdout.contains("\"identity_recorded\":false"), "{stdout}");

    let (ok, _, stderr) = leases_init(&dir.path().join("second.toml"), &registry.token).await;
    assert!(!ok && stderr.contains("another table of the same name") && stderr.contains(&genesis), "{stderr}");
    let (status, stderr) = worker_exit(&second).await.expect("the second table's worker does not start");
    assert!(!status.success() && stderr.contains(&genesis), "{stderr}");

    let worker = WorkerProcess::start(&first).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(15)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_registry_started_over_never_hands_a_live_regions_number_to_a_new_one() {
    // The registry's database made again under a live worker of eu-west-1 (number
    // 1). Before, `regions add` took the lowest unused number: eu-west-1's, for a new region.
    let client = client();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    // v2 from the epoch's first millisecond: every region issues under its own number now.
    let schedule = "initial_v2_from_ms = 1\n";
    let first = RegistryProcess::start_at(&listen, None, schedule).await.unwrap();
    assert_eq!(first.add_region(&client, "us-east-1").await.unwrap(), 0);
    assert_eq!(first.add_region(&client, "eu-west-1").await.unwrap(), 1);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = WorkerSpec::short_lease("eu-west-1", &dir.path().join("leases.db"));
    spec.extra = format!(
        "region = \"eu-west-1\"\nregistry_url = \"{}\"\nregistry_refresh_ms = 300\nschedule_cache = \"{}\"\n",
        first.url,
        dir.path().join("schedule.json").display()
    );
    let worker = WorkerProcess::start(&spec).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(15)).await.unwrap();

    // Started over: a new database at the same address.
    let mut first = first;
    first.child.kill().await.unwrap();
    let second = RegistryProcess::start_at(&listen, None, schedule).await.unwrap();
    // The worker refuses the new registry's answers, pages, and reports its number.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let regions: Value =
            client.get(format!("{}/v1/regions", second.url)).send().await.unwrap().json().await.unwrap();
        let reported = regions["numbers_in_use_elsewhere"].as_array().cloned().unwrap_or_default();
        if reported.iter().any(|held| held["number"] == 1 && held["region"] == "eu-west-1") {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never reported its number: {regions}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = worker.metrics(&client).await.unwrap();
    assert!(metrics.contains("idgen_registry_answer_refused 1"), "{metrics}");
    // Its copy is still good: it issues on.
    assert_eq!(worker.health(&client).await.unwrap().0, 200);

    // New regions get numbers nobody issues under.
    assert_eq!(second.add_region(&client, "us-east-1").await.unwrap(), 0);
    let added = second.add_region(&client, "ap-south-1").await.unwrap();
    assert_eq!(added, 2, "a new region was given a live region's number");
    let regions: Value = client.get(format!("{}/v1/regions", second.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(regions["numbers_in_use_elsewhere"][0]["number"], 1, "{regions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_sqlite_lease_file_replaced_under_a_worker_stops_it_at_its_next_renewal() {
    // A file put in the place of the lease file went unnoticed until the pool
    // recycled its connection, and the refusal new processes got sent the operator to `leases
    // init`, which let them claim beside the old file's holders.
    let client = client();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let spec = WorkerSpec::short_lease("replaced", &path);
    let worker = WorkerProcess::start(&spec).await.unwrap();
    worker.wait_ready(&client, Duration::from_secs(15)).await.unwrap();

    // A fresh file put in its place (a copy restored over it, a file made again), closed first so
    // that it is whole without its write-ahead log.
    let other = dir.path().join("other.db");
    let made = idgen::SqliteLeaseStore::open(&other, "idgen-leases").await.unwrap();
    idgen::LeaseStore::close(&made).await;
    std::fs::rename(&other, &path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = worker.health(&client).await.unwrap();
        if status == 503 {
            assert_eq!(body["reason"], "lease", "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "the worker issues on under a lease in a file replaced: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing is claimed through the path by this process again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(worker.health(&client).await.unwrap().0, 503);

    // A new process is refused the file (no genesis), and told when init is safe. (Once the old
    // process is gone: its write-ahead log, still under the path's name, belongs to the old file,
    // and the runbook has the operator remove it with the process.)
    worker.signal(libc::SIGKILL);
    for leftover in ["leases.db-wal", "leases.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(leftover));
    }
    let mut fresh = WorkerSpec::short_lease("after", &path);
    fresh.create_tables = false;
    let (status, stderr) = worker_exit(&fresh).await.expect("refused");
    assert!(!status.success() && stderr.contains("fuser") && stderr.contains("has stopped"), "{stderr}");
}
