//! Mutual TLS and quotas through the real `idgen worker`: handshakes refused for no certificate,
//! a certificate from another CA, an expired one, and (client side) a server name that does not
//! match; every accepted caller seen as itself; quotas that hold a caller to its rate without
//! slowing its neighbour; and SIGHUP rotating the server certificate while keep-alive
//! connections and leases carry on.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idgen_e2e::{WorkerProcess, WorkerSpec};
use idgen_server::pki::DevCa;

/// A development CA with a server certificate for 127.0.0.1/localhost and client certificates,
/// written into a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: DevCa,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = DevCa::new("idgen e2e CA").unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.ca_pem()).unwrap();
        ca.server(&["127.0.0.1", "localhost"]).unwrap().write(dir.path(), "server").unwrap();
        for identity in ["orders", "ingest", "bulk"] {
            ca.client(identity).unwrap().write(dir.path(), identity).unwrap();
        }
        ca.client("spiffe://corp/ns/orders/sa/api").unwrap().write(dir.path(), "spiffe").unwrap();
        ca.client_valid("orders", (2020, 1, 1), (2021, 1, 1)).unwrap().write(dir.path(), "expired").unwrap();
        let other = DevCa::new("another CA").unwrap();
        other.client("orders").unwrap().write(dir.path(), "foreign").unwrap();
        Pki { dir, ca }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The development CA names its callers by CN (`orders`, …): `identity = "cn"` (e2e_identity
    /// covers `uri_san`, the default).
    fn tls_section(&self) -> String {
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\nidentity = \"cn\"\n",
            self.path("server.pem"),
            self.path("server-key.pem"),
            self.path("ca.pem")
        )
    }

    /// A client trusting the CA, presenting `identity`'s certificate (`None`: no certificate).
    fn client(&self, identity: Option<&str>) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(self.path("ca.pem")).unwrap()).unwrap();
        let mut builder = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .tls_info(true)
            .timeout(Duration::from_secs(10));
        if let Some(identity) = identity {
            let mut pem = std::fs::read(self.path(&format!("{identity}.pem"))).unwrap();
            pem.extend(std::fs::read(self.path(&format!("{identity}-key.pem"))).unwrap());
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder.build().unwrap()
    }
}

fn worker_spec(dir: &Path, sections: String) -> WorkerSpec {
    let mut spec = WorkerSpec::short_lease("tls", &dir.join("leases.db"));
    (spec.lease_ms, spec.renew_interval_ms, spec.fence_ms) = (60_000, 2_000, 500);
    spec.sections = sections;
    spec
}

async fn health(client: &reqwest::Client, worker: &WorkerProcess) -> reqwest::Result<serde_json::Value> {
    client.get(format!("{}/healthz", worker.url)).send().await?.json().await
}

/// The DER of the server certificate the connection of this response was made with.
fn peer_certificate(response: &reqwest::Response) -> Vec<u8> {
    let info = response.extensions().get::<reqwest::tls::TlsInfo>().expect("TLS info");
    info.peer_certificate().expect("a server certificate").to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_mtls_refuses_what_it_must_and_names_every_caller() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&worker_spec(work.path(), pki.tls_section())).await.unwrap();
    assert!(worker.url.starts_with("https://127.0.0.1:"), "{}", worker.url);

    for (who, client) in [
        ("no client certificate", pki.client(None)),
        ("a certificate from another CA", pki.client(Some("foreign"))),
        ("an expired certificate", pki.client(Some("expired"))),
    ] {
        let refused = client.get(format!("{}/healthz", worker.url)).send().await;
        assert!(refused.is_err(), "{who}: the handshake must be refused, got {refused:?}");
    }
    // The client refuses a server whose certificate does not name the host it asked for.
    let port = worker.url.rsplit(':').next().unwrap();
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mismatch = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(pki.path("ca.pem")).unwrap()).unwrap())
        .resolve("wrong.example", address)
        .build()
        .unwrap();
    assert!(mismatch.get(format!("https://wrong.example:{port}/healthz")).send().await.is_err(), "name mismatch");

    // Under `cn` the CN names the caller, never the URI SAN beside it.
    for (identity, expected) in [("orders", "orders"), ("ingest", "ingest"), ("spiffe", "client")] {
        let body = health(&pki.client(Some(identity)), &worker).await.unwrap();
        assert_eq!(body["caller"], expected, "{body}");
    }
    // Through localhost too (the certificate names both).
    let by_name = pki.client(Some("orders"));
    let response = by_name.post(format!("https://localhost:{port}/v1/ids")).send().await.unwrap();
    assert_eq!(response.status(), 200);

    let text = worker.metrics(&pki.client(Some("orders"))).await.unwrap();
    for reason in ["no_client_certificate", "unknown_issuer", "certificate_expired"] {
        let series = format!("idgen_tls_handshake_failures_total{{reason=\"{reason}\"}} ");
        let count = text.lines().find_map(|l| l.strip_prefix(&series)).map(|v| v.parse::<f64>().unwrap());
        assert!(count.is_some_and(|c| c >= 1.0), "no {series:?} in\n{text}");
    }
    println!("mTLS: four refusals (three at the server, one at the client), three identities seen as themselves");
}

/// Sends `POST /v1/ids` at `rate` per second for `length` from `tasks` paced tasks; counts the
/// answers by status and checks every 429's Retry-After.
async fn drive(client: reqwest::Client, url: String, rate: u32, length: Duration) -> (u32, u32) {
    let tasks = 8u32;
    let every = Duration::from_secs_f64(f64::from(tasks) / f64::from(rate));
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                tokio::time::sleep(every / tasks * i).await;
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut ok, mut throttled) = (0, 0);
                let end = Instant::now() + length;
                while Instant::now() < end {
                    ticks.tick().await;
                    let response = client.post(&url).send().await.unwrap();
                    match response.status().as_u16() {
                        200 => ok += 1,
                        429 => {
                            let retry: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                            assert!(retry >= 1, "Retry-After {retry}");
                            let body: serde_json::Value = response.json().await.unwrap();
                            assert_eq!(body["error"]["code"], "over_quota", "{body}");
                            throttled += 1;
                        }
                        other => panic!("status {other}"),
                    }
                }
                (ok, throttled)
            })
        })
        .collect();
    let mut totals = (0, 0);
    for handle in handles {
        let (ok, throttled) = handle.await.unwrap();
        totals = (totals.0 + ok, totals.1 + throttled);
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_quotas_hold_a_caller_to_its_rate_and_not_its_neighbour() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let quotas = "[quotas]\ndefault = { ids_per_second = 1, burst = 1 }\n[quotas.callers]\n\
                  orders = { ids_per_second = 100, burst = 20 }\n\
                  ingest = { ids_per_second = 100000, burst = 10000 }\n\
                  bulk = { ids_per_second = 1000, burst = 1000 }\n";
    let worker =
        WorkerProcess::start(&worker_spec(work.path(), format!("{}{quotas}", pki.tls_section()))).await.unwrap();
    let url = format!("{}/v1/ids", worker.url);
    // orders at four times its quota, ingest at the same time well inside its own.
    let length = Duration::from_secs(3);
    let orders = tokio::spawn(drive(pki.client(Some("orders")), url.clone(), 400, length));
    let ingest = tokio::spawn(drive(pki.client(Some("ingest")), url.clone(), 200, length));
    let (orders_ok, orders_throttled) = orders.await.unwrap();
    let (ingest_ok, ingest_throttled) = ingest.await.unwrap();
    // 100 a second for 3 s plus the burst of 20: 320, within 20 %.
    assert!((256..=384).contains(&orders_ok), "orders served {orders_ok}, throttled {orders_throttled}");
    assert!(orders_throttled > 600, "orders throttled only {orders_throttled}");
    assert_eq!(ingest_throttled, 0, "ingest was slowed by orders");
    assert!(ingest_ok > 450, "ingest served only {ingest_ok}");

    // A batch of 1,000 counts 1,000.
    let bulk = pki.client(Some("bulk"));
    let batch = format!("{}/v1/ids:batch", worker.url);
    let first = bulk.post(&batch).body(r#"{"count": 1000}"#).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = bulk.post(&batch).body(r#"{"count": 1000}"#).send().await.unwrap();
    assert_eq!(second.status(), 429, "the burst of 1,000 was spent by the first batch");
    assert!(second.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    // A caller not listed has the default.
    let spiffe = pki.client(Some("spiffe"));
    assert_eq!(spiffe.post(&url).send().await.unwrap().status(), 200);
    assert_eq!(spiffe.post(&url).send().await.unwrap().status(), 429);

    let text = worker.metrics(&pki.client(Some("ingest"))).await.unwrap();
    for needle in [
        format!("idgen_caller_requests_throttled_total{{caller=\"orders\"}} {orders_throttled}"),
        "idgen_caller_ids_served_total{caller=\"bulk\"} 1000".to_owned(),
        "idgen_caller_ids_served_total{caller=\"other\"} 1".to_owned(),
    ] {
        assert!(text.contains(&needle), "missing {needle:?} in\n{text}");
    }
    println!(
        "quotas: orders at 4x got {orders_ok} (quota 320) and {orders_throttled} 429s; ingest got {ingest_ok}, none refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_sighup_rotates_the_certificate_keeps_connections_and_leases() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&worker_spec(work.path(), pki.tls_section())).await.unwrap();
    let kept = pki.client(Some("orders"));
    let first = kept.get(format!("{}/healthz", worker.url)).send().await.unwrap();
    let old_certificate = peer_certificate(&first);
    let before: serde_json::Value = first.json().await.unwrap();
    assert_eq!(before["status"], "ok", "{before}");

    // Rotate: a new server certificate from the same CA, then SIGHUP.
    pki.ca.server(&["127.0.0.1", "localhost"]).unwrap().write(pki.dir.path(), "server").unwrap();
    worker.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(5);
    let new_certificate = loop {
        let response = pki.client(Some("orders")).get(format!("{}/healthz", worker.url)).send().await.unwrap();
        let certificate = peer_certificate(&response);
        if certificate != old_certificate {
            break certificate;
        }
        assert!(Instant::now() < deadline, "new connections still get the old certificate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The keep-alive connection opened before the rotation still works, on its old handshake.
    let again = kept.get(format!("{}/healthz", worker.url)).send().await.unwrap();
    assert_eq!(peer_certificate(&again), old_certificate, "the kept connection was reused");
    let after: serde_json::Value = again.json().await.unwrap();
    assert_eq!(after["leases"][0]["machine"], before["leases"][0]["machine"], "leases untouched: {after}");
    assert_eq!(after["leases"][0]["lease_epoch"], before["leases"][0]["lease_epoch"], "{after}");

    // A broken file is refused: the certificate in force stays.
    std::fs::write(pki.path("server.pem"), "not a certificate").unwrap();
    worker.signal(libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let response = pki.client(Some("orders")).get(format!("{}/healthz", worker.url)).send().await.unwrap();
    assert_eq!(peer_certificate(&response), new_certificate);
    assert_eq!(response.status(), 200);
    println!("SIGHUP: rotated certificate served to new connections; the old connection and the lease carried on");
}
