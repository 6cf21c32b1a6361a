//! `[access]` through the real `idgen public serve` behind mutual TLS: a caller its certificate
//! names and the section lists creates, resolves and looks up; one it does not list is answered
//! 403 `forbidden` on each operation, counted on `/metrics`; and SIGHUP re-reads the section.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idgen_e2e::{client_of as client, start_public_ids};
use idgen_server::pki::DevCa;

const STOREFRONT: &str = "spiffe://idgen.test/ns/shop/sa/storefront";
const INTRUDER: &str = "spiffe://idgen.test/ns/elsewhere/sa/intruder";

fn config(dir: &Path, resolve: &[&str]) -> String {
    let file = |name: &str| -> PathBuf { dir.join(name) };
    format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\nformats = [\"opaque\", \"uuidv7\"]\n\
         [tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n\
         [access]\ncreate = [\"{STOREFRONT}\"]\nresolve = {resolve:?}\nlookup = [\"{STOREFRONT}\"]\n",
        file("p.db").display(),
        file("server.pem"),
        file("server-key.pem"),
        file("ca.pem"),
    )
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_public_access_refuses_callers_not_listed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::new("idgen e2e CA").unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.ca_pem()).unwrap();
    ca.server(&["127.0.0.1", "localhost"]).unwrap().write(dir.path(), "server").unwrap();
    ca.client(STOREFRONT).unwrap().write(dir.path(), "storefront").unwrap();
    ca.client(INTRUDER).unwrap().write(dir.path(), "intruder").unwrap();
    let (mut child, url) = start_public_ids(dir.path(), &config(dir.path(), &[STOREFRONT])).await.unwrap();
    assert!(url.starts_with("https://"), "{url}");
    let (storefront, intruder) = (client(dir.path(), "storefront"), client(dir.path(), "intruder"));

    // The listed caller: create, resolve, look up.
    let body = serde_json::json!({"internal_id": "97301141913751557", "format": "uuidv7"});
    let (status, created) = answer(storefront.post(format!("{url}/v1/public-ids")).json(&body)).await;
    assert_eq!(status, 201, "{created}");
    let public_id = created["public_id"].as_str().unwrap().to_owned();
    let (status, resolved) = answer(storefront.get(format!("{url}/v1/public-ids/{public_id}"))).await;
    assert_eq!((status, resolved["internal_id"].as_str()), (200, Some("97301141913751557")));
    let lookup = format!("{url}/v1/internal-ids/97301141913751557/public-id?format=uuidv7");
    assert_eq!(answer(storefront.get(&lookup)).await.0, 200);

    // The caller not listed: 403 on every operation, naming it, the ID's existence not told.
    for (request, operation) in [
        (intruder.post(format!("{url}/v1/public-ids")).json(&body), "create"),
        (
            intruder.post(format!("{url}/v1/public-ids:batch")).json(&serde_json::json!({"internal_ids": ["1"]})),
            "create",
        ),
        (intruder.get(format!("{url}/v1/public-ids/{public_id}")), "resolve"),
        (intruder.get(&lookup), "look up"),
    ] {
        let (status, refused) = answer(request).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("forbidden")), "{operation}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(INTRUDER) && message.contains(&format!("may not {operation}")), "{message}");
        assert!(!message.contains("97301141913751557") && !message.contains(&public_id), "{message}");
    }
    let metrics = storefront.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    for (operation, count) in [("create", 2), ("resolve", 1), ("lookup", 1)] {
        let series = format!("idgen_public_requests_forbidden_total{{operation=\"{operation}\"}} {count}\n");
        assert!(metrics.contains(&series), "{series} missing from /metrics:\n{metrics}");
    }
    assert!(metrics.contains("idgen_public_random_source_failures_total{format=\"uuidv7\"} 0\n"), "{metrics}");

    // SIGHUP re-reads [access]: the intruder, now listed for resolve, resolves.
    std::fs::write(dir.path().join("public-ids.toml"), config(dir.path(), &[STOREFRONT, INTRUDER])).unwrap();
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = answer(intruder.get(format!("{url}/v1/public-ids/{public_id}"))).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "[access] was not re-read on SIGHUP: still {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer(intruder.get(&lookup)).await.0, 403, "only resolve was granted");
    println!(
        "[access]: the listed caller served, the other refused 403 on every operation and counted; SIGHUP granted resolve"
    );
    child.kill().await.unwrap();
}
