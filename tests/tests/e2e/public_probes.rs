//! The public-ID service's probes through the real binary, as Prometheus sees them: its database
//! (PostgreSQL, dropped under it) and KMS (a moto of the test's own, stopped under it), each
//! probed every second here (`database_probe_ms`, `kms_probe_ms`). Up at the first scrape; once
//! the backend is gone, `idgen_public_database_up` / `idgen_public_kms_up` read 0 and the failed
//! calls are counted, which is what `IdgenPublicIdDatabaseDown` and `IdgenPublicIdKmsUnavailable`
//! read.

use std::time::{Duration, Instant};

use idgen_e2e::{MotoServer, start_public_ids};
use idgen_test_support::TestDatabase;

async fn scrape(client: &reqwest::Client, url: &str) -> String {
    client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Scrapes until every line is on `/metrics` (within 15 s), and returns that scrape.
async fn until_shown(client: &reqwest::Client, url: &str, lines: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = scrape(client, url).await;
        if lines.iter().all(|line| text.contains(line)) {
            return text;
        }
        assert!(Instant::now() < deadline, "{lines:?} never all shown on /metrics:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of the one series `name` on the scrape.
fn value(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_database_that_goes_away_shows_on_metrics() {
    let db = TestDatabase::postgres("public_probe").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\nformats = [\"opaque\"]\ndatabase_probe_ms = 1000\n",
        db.url()
    );
    let (mut child, url) = start_public_ids(dir.path(), &config).await.unwrap();
    let client = reqwest::Client::new();
    let text = scrape(&client, &url).await;
    for line in ["idgen_public_database_up 1\n", "idgen_public_storage_errors_total{operation=\"create\"} 0\n"] {
        assert!(text.contains(line), "{line} not on the first scrape:\n{text}");
    }
    assert!(!text.contains("idgen_public_kms_up"), "no [kms] key, no KMS probe:\n{text}");

    drop(db); // DROP DATABASE … WITH (FORCE): its connections end, and it is gone.
    let created = client
        .post(format!("{url}/v1/public-ids"))
        .json(&serde_json::json!({"internal_id": "683244571854022659"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 503);
    let body: serde_json::Value = created.json().await.unwrap();
    assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
    let text = until_shown(&client, &url, &["idgen_public_database_up 0\n"]).await;
    assert!(value(&text, "idgen_public_storage_errors_total{operation=\"create\"}") >= 1.0, "{text}");
    assert!(value(&text, "idgen_public_storage_errors_total{operation=\"probe\"}") >= 1.0, "{text}");
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_kms_that_stops_answering_shows_on_metrics() {
    let (moto, dir, config) = kms_service("idgen e2e probe").await;
    let (mut child, url) = start_public_ids(dir.path(), &config).await.unwrap();
    let client = reqwest::Client::new();
    let text = scrape(&client, &url).await;
    assert!(text.contains("idgen_public_kms_up 1\n"), "{text}");
    // The start's Decrypt, then the probe's, every second.
    let text =
        until_shown(&client, &url, &["idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"ok\"} 2\n"]).await;
    assert!(text.contains("idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"error\"} 0\n"), "{text}");

    drop(moto); // killed: KMS refuses connections
    let text = until_shown(&client, &url, &["idgen_public_kms_up 0\n"]).await;
    assert!(value(&text, "idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"error\"}") >= 1.0, "{text}");
    // The running service keeps its keys: the encrypted format still works.
    assert_eq!(create_encrypted(&client, &url).await, 200);
    child.kill().await.unwrap();
}

/// A public-ID host gives its service AWS credentials of a role of their own (KMS only) through
/// `credential_process`, with the instance metadata service, and the host role's credentials
/// with it, out of the service's reach (infra/cloudformation/global.yaml). Here the process is
/// the only source of credentials the service has: without it the service cannot start; with
/// it, it unwraps its data key, and asks the process again when the credentials it holds
/// expire (20 s here, an hour on a host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kms_credentials_come_only_from_the_credential_process() {
    let (_moto, dir, config) = kms_service("idgen e2e credentials").await;
    let calls = dir.path().join("calls.log");
    let process = dir.path().join("credentials.sh");
    // What idgen-kms-credentials leaves for the service, valid for 20 s from each call; the test
    // switches it off by creating `refuse`.
    std::fs::write(
        &process,
        format!(
            "#!/bin/sh\nset -e\n[ ! -e '{refuse}' ] || exit 1\ndate +%s >> '{calls}'\n\
             printf '{{\"Version\":1,\"AccessKeyId\":\"AKIDSERVICEROLE\",\"SecretAccessKey\":\"secret\",\
             \"SessionToken\":\"token\",\"Expiration\":\"%s\"}}' \"$(date -u -d @$(( $(date +%s) + 20 )) +%Y-%m-%dT%H:%M:%SZ)\"\n",
            refuse = dir.path().join("refuse").display(),
            calls = calls.display(),
        ),
    )
    .unwrap();
    let aws_config = dir.path().join("aws.config");
    std::fs::write(&aws_config, format!("[default]\ncredential_process = sh {}\n", process.display())).unwrap();
    let env = [
        ("AWS_CONFIG_FILE".to_owned(), aws_config.display().to_string()),
        ("AWS_SHARED_CREDENTIALS_FILE".to_owned(), dir.path().join("no-credentials").display().to_string()),
        ("AWS_EC2_METADATA_DISABLED".to_owned(), "true".to_owned()),
    ];
    let remove = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"];
    let path = dir.path().join("public-ids.toml");
    std::fs::write(&path, config).unwrap();
    let args = ["public", "serve", "--config", path.to_str().unwrap()];
    let ready = "idgen-public-ids listening on ";

    // The process refuses: no other source is left, so no KMS call can be signed.
    std::fs::write(dir.path().join("refuse"), "").unwrap();
    let refused = idgen_e2e::start_idgen_without(&args, &env, &remove, ready).await.err().map(|e| format!("{e:#}"));
    let refused = refused.expect("the service started with no credentials but the process's");
    assert!(refused.contains("exited before listening"), "{refused}");
    assert!(!calls.exists());

    std::fs::remove_file(dir.path().join("refuse")).unwrap();
    let (mut child, line) = idgen_e2e::start_idgen_without(&args, &env, &remove, ready).await.unwrap();
    let url = idgen_e2e::urls_of(&line).unwrap().0;
    let client = reqwest::Client::new();
    let text = scrape(&client, &url).await;
    assert!(text.contains("idgen_public_kms_up 1\n"), "{text}");
    assert_eq!(create_encrypted(&client, &url).await, 200);
    // The probe asks KMS every second: near the credentials' expiry (the SDK renews 10 s ahead)
    // it runs the process again. Starting runs it once per client; a renewal is a call made
    // well after the first.
    let call_times =
        || -> Vec<u64> { std::fs::read_to_string(&calls).unwrap().lines().map(|line| line.parse().unwrap()).collect() };
    let first = call_times()[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !call_times().iter().any(|&at| at >= first + 5) {
        assert!(
            Instant::now() < deadline,
            "the credential process was not run again as its credentials expired: {:?}",
            call_times()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = scrape(&client, &url).await;
    assert!(text.contains("idgen_public_kms_up 1\n"), "{text}");
    assert!(text.contains("idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"error\"} 0\n"), "{text}");
    child.kill().await.unwrap();
}

/// A moto server with a KMS key, a directory, and the configuration of a development public-ID
/// service on SQLite there whose encrypted format's data key that key wraps (probed every
/// second).
async fn kms_service(description: &str) -> (MotoServer, tempfile::TempDir, String) {
    let moto = MotoServer::start().await.unwrap();
    let settings = idgen_aws::AwsSettings { endpoint: Some(moto.endpoint.clone()), ..Default::default() }.patient();
    let kms = idgen_public_ids::kms::client(&settings).await;
    let key = kms.create_key().description(description).send().await.unwrap();
    let key_id = key.key_metadata().unwrap().key_id().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\nkms_probe_ms = 1000\n[kms]\nkey_id = \"{key_id}\"\nendpoint = \"{}\"\n",
        dir.path().join("p.db").display(),
        moto.endpoint
    );
    (moto, dir, config)
}

/// The status of a create in the encrypted format, the one that needs the KMS-unwrapped key.
async fn create_encrypted(client: &reqwest::Client, url: &str) -> reqwest::StatusCode {
    let created = client
        .post(format!("{url}/v1/public-ids"))
        .json(&serde_json::json!({"internal_id": "683244571854022659", "format": "encrypted"}))
        .send()
        .await
        .unwrap();
    created.status()
}
