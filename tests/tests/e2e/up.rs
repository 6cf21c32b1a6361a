//! `idgen up`, the README's first command, through the binary: plain, and with `--tls` (every
//! listener behind mutual TLS with the development certificates it makes).

use std::path::Path;
use std::time::Duration;

/// Starts `idgen up` in `dir` and waits for "idgen is up".
async fn up(dir: &Path, extra: &[&str]) -> (tokio::process::Child, u16) {
    idgen_e2e::start_up(dir, extra).await
}

async fn stop(mut child: tokio::process::Child) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "idgen up stopped with {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_up_starts_the_platform_and_ctrl_c_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = up(dir.path(), &[]).await;
    let client = reqwest::Client::new();
    let answer: serde_json::Value =
        client.post(format!("http://127.0.0.1:{}/v1/ids", port + 1)).send().await.unwrap().json().await.unwrap();
    assert!(answer["id"].as_str().is_some_and(|id| id.parse::<u64>().is_ok()), "{answer}");
    let health: serde_json::Value =
        client.get(format!("http://127.0.0.1:{}/healthz", port + 3)).send().await.unwrap().json().await.unwrap();
    assert_eq!((health["caller"].as_str(), health["mode"].as_str()), (Some("anonymous"), Some("development")));

    // `idgen ids`, the client library from the command line: plain for scripts, JSON decoded
    // with the registry's schedule, UUIDs; a dead local endpoint falls over to the backup.
    let worker = format!("http://127.0.0.1:{}", port + 1);
    let plain = idgen_e2e::idgen(&["ids", "--url", &worker, "--count", "3"]).await.unwrap();
    let ids: Vec<u64> = plain.lines().map(|line| line.parse().unwrap()).collect();
    assert!(ids.len() == 3 && ids.windows(2).all(|w| w[0] < w[1]), "{plain}");
    let registry = format!("http://127.0.0.1:{port}");
    let dead = "http://127.0.0.1:1";
    let json = idgen_e2e::idgen(&["ids", "--url", dead, "--backup", &worker, "--registry", &registry, "--json"])
        .await
        .unwrap();
    let line: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!((line["endpoint"].as_str(), line["layout"].as_str()), (Some(worker.as_str()), Some("v1")), "{line}");
    assert!(line["machine"].as_u64().is_some() && line["created_at"].is_string(), "{line}");
    let uuids = idgen_e2e::idgen(&["ids", "--url", &worker, "--uuid", "--count", "2"]).await.unwrap();
    assert!(uuids.lines().count() == 2 && uuids.lines().all(|u| u.len() == 36 && &u[14..15] == "7"), "{uuids}");

    // Every public-ID format, the encrypted one with the development data key `up` keeps under
    // its directory (a 28-character ID that resolves back).
    let public = format!("http://127.0.0.1:{}", port + 9);
    for format in ["opaque", "uuidv7", "encrypted"] {
        let made = idgen_e2e::idgen(&["public", "create", "--url", &public, "97301141913751557", "--format", format])
            .await
            .unwrap();
        let made = made.trim();
        let back = idgen_e2e::idgen(&["public", "resolve", "--url", &public, made]).await.unwrap();
        assert_eq!(back.trim(), "97301141913751557", "{format}: {made}");
        assert!(format != "encrypted" || made.len() == 28, "{made}");
    }
    let key = std::fs::read_to_string(dir.path().join(".idgen/public-ids-data-key")).unwrap();
    assert_eq!(key.trim().len(), 64, "the development data key is 32 bytes of hex");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join(".idgen/public-ids-data-key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the development data key is readable by its owner only");
    stop(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_up_tls_puts_every_listener_behind_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = up(dir.path(), &["--tls"]).await;
    let tls = dir.path().join(".idgen/tls");
    let ca = reqwest::Certificate::from_pem(&std::fs::read(tls.join("ca.pem")).unwrap()).unwrap();
    let as_identity = |identity: &str| {
        let mut pem = std::fs::read(tls.join(format!("{identity}.pem"))).unwrap();
        pem.extend(std::fs::read(tls.join(format!("{identity}-key.pem"))).unwrap());
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone())
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap()
    };
    let orders = as_identity("orders");
    let worker = format!("https://127.0.0.1:{}", port + 1);
    let answer = orders.post(format!("{worker}/v1/ids")).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let health: serde_json::Value =
        as_identity("ingest").get(format!("{worker}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["caller"], "ingest", "{health}");
    // Every listener refuses a connection without a client certificate.
    let anonymous = reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(ca).build().unwrap();
    for listener in [port, port + 1, port + 9] {
        let refused = anonymous.get(format!("https://127.0.0.1:{listener}/healthz")).send().await;
        assert!(refused.is_err(), "port {listener} served a caller without a certificate");
    }
    // The public-ID service, as orders; the registry's operator by certificate, from the CLI.
    let created = orders
        .post(format!("https://127.0.0.1:{}/v1/public-ids", port + 9))
        .body(r#"{"internal_id": "97301141913751557"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let file = |name: &str| tls.join(name).to_string_lossy().into_owned();
    let added = idgen_e2e::idgen(&[
        "regions",
        "--registry",
        &format!("https://127.0.0.1:{port}"),
        "--cacert",
        &file("ca.pem"),
        "--cert",
        &file("operator.pem"),
        "--key",
        &file("operator-key.pem"),
        "--token-file",
        "/nonexistent",
        "add",
        "eu-west-1",
    ])
    .await
    .unwrap();
    assert!(added.contains("number 1"), "{added}");
    stop(child).await;
}
