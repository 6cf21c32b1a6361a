//! Identities that cannot be confused, through the real `idgen worker` and `idgen registry`: under
//! `identity = "uri_san"` (the default) a CN-only certificate (`CN=orders`, `CN=ops-oncall`) names
//! nobody, and neither does one with two URI SANs or the reserved `anonymous`; under `cn` a
//! certificate named `anonymous` or `other` is refused instead of merging with those; the
//! registry takes as an operator only a certificate its operator CA issued itself, and a
//! certificate of the callers' CA, or of a subordinate of the operators' root, naming an operator
//! is refused its write and counted; a revoked certificate is
//! refused at the handshake, and a new CRL with SIGHUP revokes one that was accepted before. Every
//! refusal is counted under its reason.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idgen_e2e::{RegistryProcess, WorkerProcess, WorkerSpec};
use idgen_server::pki::{DevCa, Issued};

const ORDERS: &str = "spiffe://corp/ns/orders/sa/api";
const OPS: &str = "spiffe://corp/operator/ops-oncall";

/// A callers' CA, an operators' CA and a server certificate, written into a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    callers: DevCa,
    operators: DevCa,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let callers = DevCa::new("idgen e2e callers' CA").unwrap();
        let operators = DevCa::new("idgen e2e operators' CA").unwrap();
        std::fs::write(dir.path().join("ca.pem"), callers.ca_pem()).unwrap();
        std::fs::write(dir.path().join("operators-ca.pem"), operators.ca_pem()).unwrap();
        callers.server(&["127.0.0.1", "localhost"]).unwrap().write(dir.path(), "server").unwrap();
        Pki { dir, callers, operators }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Writes `issued` as `name` and returns it.
    fn keep(&self, name: &str, issued: Issued) -> Issued {
        issued.write(self.dir.path(), name).unwrap();
        issued
    }

    fn tls_section(&self, extra: &str) -> String {
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n{extra}",
            self.path("server.pem"),
            self.path("server-key.pem"),
            self.path("ca.pem")
        )
    }

    /// An operator (`OPS`, written as "operator") and a caller (written as "worker"), each CA
    /// with an empty CRL, and the registry configuration that takes them with `limits` after:
    /// the operator's certificate can then be revoked by a reload.
    fn revocable_operator(&self, limits: &str) -> (Issued, String) {
        let operator = self.keep("operator", self.operators.client(OPS).unwrap());
        self.keep("worker", self.callers.client("spiffe://corp/fleet/eu-west-1").unwrap());
        std::fs::write(self.path("callers-crl.pem"), self.callers.crl(&[]).unwrap()).unwrap();
        std::fs::write(self.path("operators-crl.pem"), self.operators.crl(&[]).unwrap()).unwrap();
        let tls = format!(
            "operator_ca = {:?}\ncrl = [{:?}, {:?}]\n{limits}",
            self.path("operators-ca.pem"),
            self.path("callers-crl.pem"),
            self.path("operators-crl.pem")
        );
        (operator, format!("certificate_operators = [\"{OPS}\"]\n{}", self.tls_section(&tls)))
    }

    /// A client trusting the server's CA, presenting `name`'s certificate.
    fn client(&self, name: &str) -> reqwest::Client {
        idgen_e2e::client_of(self.dir.path(), name)
    }
}

fn worker_spec(dir: &Path, sections: String) -> WorkerSpec {
    let mut spec = WorkerSpec::short_lease("identity", &dir.join("leases.db"));
    (spec.lease_ms, spec.renew_interval_ms, spec.fence_ms) = (60_000, 2_000, 500);
    spec.sections = sections;
    spec
}

/// `GET /healthz` as `name`: the caller the service saw, or the error of a refused handshake.
async fn caller_seen(pki: &Pki, url: &str, name: &str) -> Result<String, String> {
    let response = pki.client(name).get(format!("{url}/healthz")).send().await.map_err(|e| format!("{e:?}"))?;
    let body: serde_json::Value = response.json().await.map_err(|e| format!("{e:?}"))?;
    Ok(body["caller"].as_str().unwrap_or_default().to_owned())
}

/// The value of one series in a `/metrics` text.
fn series(text: &str, name: &str, reason: &str) -> f64 {
    let prefix = format!("{name}{{reason=\"{reason}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap()).unwrap_or_else(|| {
        panic!("no {prefix:?} in\n{text}");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_under_uri_san_only_one_uri_san_names_a_caller() {
    let pki = Pki::new();
    pki.keep("orders-uri", pki.callers.client(ORDERS).unwrap());
    // The issue's confusions: a bare CN passing for a caller (and its quota), or for anonymous.
    pki.keep("cn-orders", pki.callers.client("orders").unwrap());
    pki.keep("cn-ops", pki.callers.client("ops-oncall").unwrap());
    pki.keep("uri-anonymous", pki.callers.client_named(Some("orders"), &["anonymous"]).unwrap());
    pki.keep("two-uris", pki.callers.client_named(None, &[ORDERS, "spiffe://corp/ns/billing/sa/api"]).unwrap());
    let work = tempfile::tempdir().unwrap();
    // `orders` has a quota under its CN and under its URI: only the URI can spend it.
    let quotas = format!(
        "[quotas]\ndefault = {{ ids_per_second = 1, burst = 1 }}\n[quotas.callers]\norders = {{ ids_per_second = 1000, burst = 1000 }}\n\"{ORDERS}\" = {{ ids_per_second = 1000, burst = 1000 }}\n"
    );
    let spec = worker_spec(work.path(), format!("{}{quotas}", pki.tls_section("")));
    let worker = WorkerProcess::start(&spec).await.unwrap();

    assert_eq!(caller_seen(&pki, &worker.url, "orders-uri").await, Ok(ORDERS.to_owned()));
    for name in ["cn-orders", "cn-ops", "uri-anonymous", "two-uris"] {
        let seen = caller_seen(&pki, &worker.url, name).await;
        assert!(seen.is_err(), "{name}: the connection must be closed, the service saw {seen:?}");
        let issued = pki.client(name).post(format!("{}/v1/ids", worker.url)).send().await;
        assert!(issued.is_err(), "{name} was issued an ID: {issued:?}");
    }
    let text = worker.metrics(&pki.client("orders-uri")).await.unwrap();
    let failures = "idgen_tls_handshake_failures_total";
    // Each refused certificate tried twice (a client may try a refused connection once more).
    assert!(series(&text, failures, "certificate_names_nobody") >= 4.0, "cn-orders and cn-ops:\n{text}");
    assert!(series(&text, failures, "reserved_identity") >= 2.0);
    assert!(series(&text, failures, "certificate_names_several") >= 2.0);
    assert!(!text.contains("idgen_caller_ids_served_total{caller=\"orders\"} 1"), "CN=orders spent a quota:\n{text}");
    println!("uri_san: one URI SAN named its caller; CN-only, anonymous and two-URI certificates refused and counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_under_cn_reserved_names_are_refused_not_merged() {
    let pki = Pki::new();
    pki.keep("orders", pki.callers.client("orders").unwrap());
    pki.keep("anonymous", pki.callers.client("anonymous").unwrap());
    pki.keep("other", pki.callers.client("Other").unwrap());
    pki.keep("cn-and-uri", pki.callers.client_named(Some("ingest"), &[ORDERS]).unwrap());
    let work = tempfile::tempdir().unwrap();
    let spec = worker_spec(work.path(), pki.tls_section("identity = \"cn\"\n"));
    let worker = WorkerProcess::start(&spec).await.unwrap();

    assert_eq!(caller_seen(&pki, &worker.url, "orders").await, Ok("orders".to_owned()));
    assert_eq!(caller_seen(&pki, &worker.url, "cn-and-uri").await, Ok("ingest".to_owned()), "the URI is not read");
    for name in ["anonymous", "other"] {
        let seen = caller_seen(&pki, &worker.url, name).await;
        assert!(seen.is_err(), "{name}: the connection must be closed, the service saw {seen:?}");
    }
    let text = worker.metrics(&pki.client("orders")).await.unwrap();
    assert!(series(&text, "idgen_tls_handshake_failures_total", "reserved_identity") >= 2.0, "{text}");
    println!("cn: the CN named its caller; CN=anonymous and CN=Other refused and counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_only_the_operator_ca_makes_a_registry_operator() {
    let pki = Pki::new();
    pki.keep("operator", pki.operators.client(OPS).unwrap());
    pki.keep("impostor", pki.callers.client(OPS).unwrap());
    pki.keep("cn-ops", pki.callers.client("ops-oncall").unwrap());
    pki.keep("worker", pki.callers.client("spiffe://corp/fleet/eu-west-1").unwrap());
    let extra = format!(
        "certificate_operators = [\"{OPS}\"]\n{}",
        pki.tls_section(&format!("operator_ca = {:?}\n", pki.path("operators-ca.pem")))
    );
    let registry = RegistryProcess::start(&extra).await.unwrap();
    let add = |name: &str, region: &str| {
        pki.client(name)
            .post(format!("{}/v1/regions", registry.url))
            .json(&serde_json::json!({ "name": region }))
            .send()
    };

    // A certificate of the callers' CA with the operator's name: refused (403), with or without a
    // token, and counted.
    let refused = add("impostor", "eu-west-1").await.unwrap();
    assert_eq!(refused.status(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_an_operator_certificate", "{body}");
    let with_token = pki
        .client("impostor")
        .post(format!("{}/v1/regions", registry.url))
        .bearer_auth(&registry.token)
        .json(&serde_json::json!({ "name": "eu-west-1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 403);
    // A certificate of a subordinate CA the operators' root issued for workloads (a private CA's
    // export), sent with that intermediate: it passes the handshake (it chains to the root), names
    // the operator, and is refused as the callers' are.
    let workloads = pki.operators.subordinate("idgen e2e workloads' CA").unwrap();
    let through = pki.keep("through", workloads.client(OPS).unwrap());
    std::fs::write(pki.path("through.pem"), format!("{}{}", through.cert_pem, workloads.ca_pem())).unwrap();
    let refused = add("through", "eu-west-2").await.unwrap();
    assert_eq!(refused.status(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_an_operator_certificate", "{body}");
    // `CN=ops-oncall` without a URI SAN names nobody at all.
    assert!(add("cn-ops", "eu-west-1").await.is_err(), "CN=ops-oncall got an answer");
    // A worker's certificate reads, and cannot write.
    assert_eq!(pki.client("worker").get(format!("{}/v1/regions", registry.url)).send().await.unwrap().status(), 200);
    assert_eq!(add("worker", "eu-west-1").await.unwrap().status(), 401);
    // The operators' CA's certificate writes, and the audit names it.
    assert_eq!(add("operator", "eu-west-1").await.unwrap().status(), 201);
    let audit: serde_json::Value =
        pki.client("operator").get(format!("{}/v1/audit", registry.url)).send().await.unwrap().json().await.unwrap();
    assert!(audit.to_string().contains(OPS), "{audit}");
    assert_eq!(audit.to_string().matches("eu-west-1").count(), 1, "one write only: {audit}");

    let text =
        pki.client("worker").get(format!("{}/metrics", registry.url)).send().await.unwrap().text().await.unwrap();
    let refusals = "idgen_registry_writes_refused_total";
    assert_eq!(series(&text, refusals, "not_an_operator_certificate"), 3.0);
    assert_eq!(series(&text, refusals, "no_credentials"), 1.0);
    assert!(series(&text, "idgen_tls_handshake_failures_total", "certificate_names_nobody") >= 1.0);
    println!(
        "registry: the operator CA's certificate wrote; the same name from the callers' CA (twice) and through a \
         subordinate of the operators' root was refused, counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_crl_revokes_at_the_handshake_and_a_new_one_on_sighup() {
    let pki = Pki::new();
    let good = pki.keep("good", pki.callers.client(ORDERS).unwrap());
    let leaked = pki.keep("leaked", pki.callers.client("spiffe://corp/ns/leaked/sa/api").unwrap());
    std::fs::write(pki.path("crl.pem"), pki.callers.crl(&[&leaked]).unwrap()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let crl = format!("crl = [{:?}]\n", pki.path("crl.pem"));
    let worker = WorkerProcess::start(&worker_spec(work.path(), pki.tls_section(&crl))).await.unwrap();

    assert_eq!(caller_seen(&pki, &worker.url, "good").await, Ok(ORDERS.to_owned()));
    let refused = caller_seen(&pki, &worker.url, "leaked").await;
    assert!(refused.is_err(), "a revoked certificate was served: {refused:?}");

    // A new list revoking `good` as well, then SIGHUP: new connections with it are refused.
    std::fs::write(pki.path("crl.pem"), pki.callers.crl(&[&leaked, &good]).unwrap()).unwrap();
    worker.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while caller_seen(&pki, &worker.url, "good").await.is_ok() {
        assert!(Instant::now() < deadline, "the new CRL was not in force 10 s after SIGHUP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A list that does not parse is refused: the one in force stays.
    std::fs::write(pki.path("crl.pem"), "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n").unwrap();
    worker.signal(libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(caller_seen(&pki, &worker.url, "good").await.is_err(), "a broken CRL file lifted the revocation");

    pki.keep("fresh", pki.callers.client("spiffe://corp/ns/fresh/sa/api").unwrap());
    let text = worker.metrics(&pki.client("fresh")).await.unwrap();
    assert!(series(&text, "idgen_tls_handshake_failures_total", "certificate_revoked") >= 2.0, "{text}");
    println!("CRL: the revoked certificate was refused; a new list on SIGHUP revoked one accepted before");
}

/// An operator's connection open across a reload of a CRL that revokes its certificate is closed
/// by the reload: its next request never reaches a handler (the region it asks for is not added),
/// and a new connection with that certificate is refused at the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_reload_revoking_an_operators_certificate_closes_its_open_connection() {
    let pki = Pki::new();
    let (operator, extra) = pki.revocable_operator("");
    let registry = RegistryProcess::start(&extra).await.unwrap();
    // One client, one kept-alive connection.
    let client = pki.client("operator");
    let add = |region: &'static str| {
        client.post(format!("{}/v1/regions", registry.url)).json(&serde_json::json!({ "name": region })).send()
    };
    assert_eq!(add("eu-west-1").await.unwrap().status(), 201);

    // The operator's certificate leaks: a new CRL revoking it, and SIGHUP.
    std::fs::write(pki.path("operators-crl.pem"), pki.operators.crl(&[&operator]).unwrap()).unwrap();
    registry.signal(libc::SIGHUP);
    let reader = pki.client("worker");
    let metrics =
        || async { reader.get(format!("{}/metrics", registry.url)).send().await.unwrap().text().await.unwrap() };
    let deadline = Instant::now() + Duration::from_secs(10);
    let revoked = |text: String| {
        let line = "idgen_connections_timed_out_total{listener=\"service\",deadline=\"revoked\"} ";
        text.lines().find_map(|l| l.strip_prefix(line)).map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    while revoked(metrics().await) < 1.0 {
        assert!(Instant::now() < deadline, "the open connection was not closed 10 s after SIGHUP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its next request (on a new connection, the old one being closed) is refused at the
    // handshake; nothing reached the handler.
    assert!(add("eu-west-2").await.is_err(), "a revoked operator's request was answered");
    let regions: serde_json::Value =
        reader.get(format!("{}/v1/regions", registry.url)).send().await.unwrap().json().await.unwrap();
    assert!(!regions.to_string().contains("eu-west-2"), "{regions}");
    println!(
        "registry: a CRL reloaded on SIGHUP closed the revoked operator's open connection; its next write never ran"
    );
}

/// `/metrics` shows every caller's volumes, so over mutual TLS only the identities
/// `tls.metrics_readers` lists read it, through the worker's own handler and the shared one (the
/// public-ID service, as the registry): the scraper's certificate gets the text, another caller's
/// 403 `forbidden` (on the code before, every certified caller got it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_only_listed_callers_read_metrics() {
    const SCRAPER: &str = "spiffe://corp/idgen/metrics";
    let pki = Pki::new();
    pki.keep("scraper", pki.callers.client(SCRAPER).unwrap());
    pki.keep("orders", pki.callers.client(ORDERS).unwrap());
    let readers = format!("metrics_readers = [\"{SCRAPER}\"]\n");
    let work = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&worker_spec(work.path(), pki.tls_section(&readers))).await.unwrap();
    let public = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\nformats = [\"opaque\"]\n{}",
        work.path().join("public-ids.db").display(),
        pki.tls_section(&readers)
    );
    let (_public, public_url) = idgen_e2e::start_public_ids(work.path(), &public).await.unwrap();
    for url in [&worker.url, &public_url] {
        let read = pki.client("scraper").get(format!("{url}/metrics")).send().await.unwrap();
        assert_eq!(read.status(), 200, "{url}");
        assert!(read.text().await.unwrap().contains("idgen_caller_ids_served_total"), "{url}");
        let refused = pki.client("orders").get(format!("{url}/metrics")).send().await.unwrap();
        assert_eq!(refused.status(), 403, "{url}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["code"], "forbidden", "{url}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(ORDERS), "{body}");
    }
    println!("/metrics: the listed scraper read it on the worker and the public-ID service, another caller got 403");
}

/// A TLS 1.3 client driven by hand: the handshake runs until the server's flight is taken, and the
/// client's last flight (its certificate, its signature, its Finished) waits unsent in `tls`
/// until the caller writes it, with whatever was written to `tls.writer()` meanwhile.
fn handshake_held(pki: &Pki, url: &str, name: &str) -> (std::net::TcpStream, rustls::ClientConnection) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(pki.path("ca.pem")).unwrap()).unwrap();
    let chain = vec![CertificateDer::from_pem_file(pki.path(&format!("{name}.pem"))).unwrap()];
    let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{name}-key.pem"))).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let mut socket = std::net::TcpStream::connect(url.trim_start_matches("https://")).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let server = ServerName::try_from("localhost").unwrap();
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), server).unwrap();
    while tls.wants_write() {
        tls.write_tls(&mut socket).unwrap(); // the ClientHello
    }
    while tls.is_handshaking() {
        assert!(tls.read_tls(&mut socket).unwrap() > 0, "the server closed during the handshake");
        tls.process_new_packets().unwrap();
    }
    (socket, tls)
}

/// An operator whose certificate is revoked while its handshake is half done (the server's flight
/// taken, its own last flight held back, well within the handshake deadline) finishes the
/// handshake after the reload: the connection is checked again against the configuration in
/// force once it is open, and closed before its request reaches a handler (before, it was
/// checked only against the configuration its handshake began with, and the reload's sweep of open
/// connections came before it was one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_handshake_held_across_a_revoking_reload_opens_a_closed_connection() {
    use std::io::{Read, Write};
    let pki = Pki::new();
    let (operator, extra) = pki.revocable_operator("[limits]\nhandshake_timeout_ms = 30000\n");
    let registry = RegistryProcess::start(&extra).await.unwrap();

    let url = registry.url.clone();
    let held = tokio::task::spawn_blocking(move || {
        let pki = pki;
        let (socket, mut tls) = handshake_held(&pki, &url, "operator");
        let body = r#"{"name":"eu-west-2"}"#;
        let request = format!(
            "POST /v1/regions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tls.writer().write_all(request.as_bytes()).unwrap();
        (pki, socket, tls)
    });
    let (pki, mut socket, mut tls) = held.await.unwrap();

    // The certificate leaks: a new CRL revoking it, and SIGHUP; a new handshake is refused once
    // the reload is in force.
    std::fs::write(pki.path("operators-crl.pem"), pki.operators.crl(&[&operator]).unwrap()).unwrap();
    registry.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pki.client("operator").get(format!("{}/healthz", registry.url)).send().await.is_ok() {
        assert!(Instant::now() < deadline, "the new CRL was not in force 10 s after SIGHUP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The held flight, and the request behind it.
    let answer = tokio::task::spawn_blocking(move || {
        while tls.wants_write() {
            tls.write_tls(&mut socket).unwrap();
        }
        let mut answer = Vec::new();
        loop {
            match tls.read_tls(&mut socket) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if tls.process_new_packets().is_err() {
                break;
            }
            let _ = tls.reader().read_to_end(&mut answer);
        }
        String::from_utf8_lossy(&answer).into_owned()
    });
    let answer = answer.await.unwrap();
    assert!(answer.is_empty(), "a revoked operator's held handshake was answered: {answer:?}");
    let reader = pki.client("worker");
    let regions: serde_json::Value =
        reader.get(format!("{}/v1/regions", registry.url)).send().await.unwrap().json().await.unwrap();
    assert!(!regions.to_string().contains("eu-west-2"), "{regions}");
    let text = reader.get(format!("{}/metrics", registry.url)).send().await.unwrap().text().await.unwrap();
    let line = "idgen_connections_timed_out_total{listener=\"service\",deadline=\"revoked\"} ";
    let revoked = text.lines().find_map(|l| l.strip_prefix(line)).map_or(0.0, |v| v.parse::<f64>().unwrap());
    assert!(revoked >= 1.0, "{text}");
    println!(
        "registry: a handshake held across a revoking reload finished into a closed connection; its write never ran"
    );
}

/// An operator taken off `certificate_operators` loses its writes at the SIGHUP that reloads the
/// list, as one taken off `[operators]` does, and its open connection is closed as a revoked
/// certificate's is (before, the list was read only at start-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_an_operator_taken_off_the_list_writes_no_more_after_sighup() {
    let pki = Pki::new();
    pki.keep("operator", pki.operators.client(OPS).unwrap());
    pki.keep("worker", pki.callers.client("spiffe://corp/fleet/eu-west-1").unwrap());
    let listed = format!("certificate_operators = [\"{OPS}\"]\n");
    let tls = format!("operator_ca = {:?}\n", pki.path("operators-ca.pem"));
    let registry = RegistryProcess::start(&format!("{listed}{}", pki.tls_section(&tls))).await.unwrap();
    let client = pki.client("operator");
    let add = |region: &'static str| {
        client.post(format!("{}/v1/regions", registry.url)).json(&serde_json::json!({ "name": region })).send()
    };
    assert_eq!(add("eu-west-1").await.unwrap().status(), 201);

    let config = std::fs::read_to_string(registry.config_path()).unwrap();
    assert!(config.contains(&listed));
    std::fs::write(registry.config_path(), config.replace(&listed, "certificate_operators = []\n")).unwrap();
    registry.signal(libc::SIGHUP);
    let reader = pki.client("worker");
    let metrics =
        || async { reader.get(format!("{}/metrics", registry.url)).send().await.unwrap().text().await.unwrap() };
    let revoked = |text: String| {
        let line = "idgen_connections_timed_out_total{listener=\"service\",deadline=\"revoked\"} ";
        text.lines().find_map(|l| l.strip_prefix(line)).map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while revoked(metrics().await) < 1.0 {
        assert!(Instant::now() < deadline, "the removed operator's open connection was not closed 10 s after SIGHUP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its certificate is still good for a handshake; the write is an unknown caller's.
    let refused = add("eu-west-2").await.unwrap();
    assert_eq!(refused.status(), 401);
    let regions: serde_json::Value =
        reader.get(format!("{}/v1/regions", registry.url)).send().await.unwrap().json().await.unwrap();
    assert!(!regions.to_string().contains("eu-west-2"), "{regions}");
    println!("registry: an operator taken off certificate_operators on SIGHUP lost its connection and its writes");
}
