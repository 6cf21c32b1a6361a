//! The lease-store conformance suite on DynamoDB, against a DynamoDB-protocol server on loopback
//! (moto, started by ./scripts/test, which exports IDGEN_DYNAMODB_ENDPOINT). Each test uses its
//! own freshly created tables. Unreachable server: the tests fail, they never skip. Credentials
//! come from the environment (./scripts/test exports dummy ones the local server accepts).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use idgen::conformance::StoreFactory;
use idgen::{DynamoDbLeaseStore, DynamoDbSettings, LeaseStore};

struct DynamoFactory {
    settings: DynamoDbSettings,
    table: String,
}

#[async_trait]
impl StoreFactory for DynamoFactory {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let client = idgen::dynamodb::client(&self.settings).await;
        Arc::new(DynamoDbLeaseStore::new(client, &self.table))
    }
}

pub fn endpoint() -> String {
    std::env::var("IDGEN_DYNAMODB_ENDPOINT").expect(
        "IDGEN_DYNAMODB_ENDPOINT is not set: these tests need a DynamoDB-protocol server (./scripts/test starts moto)",
    )
}

async fn factory() -> DynamoFactory {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let settings = DynamoDbSettings { endpoint: Some(endpoint()), ..DynamoDbSettings::default() };
    let table =
        format!("conformance-{}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed), rand_suffix());
    let store = DynamoDbLeaseStore::new(idgen::dynamodb::client(&settings).await, &table);
    store.create_tables().await.expect("creating tables on the DynamoDB-protocol server");
    store.create_tables().await.expect("creating tables is idempotent");
    DynamoFactory { settings, table }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007
}

idgen::lease_store_conformance!(factory);

/// A loopback proxy in front of the DynamoDB-protocol server that, once, forwards a request whose
/// body contains `marker` and lets the server apply it, then closes the connection instead of
/// answering: the write applied, its answer was lost, and the SDK retries.
async fn answer_losing_proxy(marker: &'static str) -> (String, Arc<AtomicU32>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = endpoint().trim_start_matches("http://").to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dropped = Arc::new(AtomicU32::new(0));
    let counter = dropped.clone();
    /// One HTTP/1.1 message (headers and a Content-Length body) from `stream`, or None at EOF.
    async fn message(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
        let mut data = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                    .unwrap_or(0);
                if data.len() >= end + 4 + length {
                    return Some(data);
                }
            }
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            data.extend_from_slice(&buf[..n]);
        }
    }
    tokio::spawn(async move {
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            let (upstream, counter) = (upstream.clone(), counter.clone());
            tokio::spawn(async move {
                while let Some(request) = message(&mut client).await {
                    let mut server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                    server.write_all(&request).await.unwrap();
                    let Some(response) = message(&mut server).await else { return };
                    let text = String::from_utf8_lossy(&request);
                    if text.contains(marker) && counter.fetch_add(1, Ordering::SeqCst) == 0 {
                        return; // applied upstream; the answer never reaches the client
                    }
                    client.write_all(&response).await.unwrap();
                }
            });
        }
    });
    (url, dropped)
}

/// A store whose client goes through [`answer_losing_proxy`], on a fresh table.
async fn through_proxy(marker: &'static str) -> (Arc<dyn LeaseStore>, Arc<dyn LeaseStore>, Arc<AtomicU32>) {
    let factory = factory().await;
    let (url, dropped) = answer_losing_proxy(marker).await;
    let settings = DynamoDbSettings { endpoint: Some(url), max_attempts: 3, ..DynamoDbSettings::default() };
    let lossy = DynamoDbLeaseStore::new(idgen::dynamodb::client(&settings).await, &factory.table);
    (Arc::new(lossy), factory.open().await, dropped)
}

const T0: i64 = 1_790_424_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_ours_on_the_retry() {
    let (lossy, direct, dropped) = through_proxy("claim_token").await;
    let outcome = lossy.claim(9, "a/pid-1/1/00", T0, T0 + 300_000).await.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "the first answer was lost and the SDK retried");
    let idgen::ClaimOutcome::Claimed(row) = outcome else { panic!("{outcome:?}") };
    assert_eq!(row.lease_epoch, 1, "claimed once, not twice");
    assert_eq!(direct.get(9).await.unwrap(), Some(row));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lift_whose_answer_was_lost_reports_lifted() {
    // Before, the retry met the row its first attempt had lifted and answered "not quarantined".
    let (lossy, direct, dropped) = through_proxy("released-by:").await;
    direct.claim(12, "a", T0, T0 + 300_000).await.unwrap();
    let quarantined = direct.quarantine(12, "oncall", T0 + 1).await.unwrap();
    let lifted = lossy.release_quarantine(12, "oncall", T0 + 600_000, T0 + 2).await.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "the first answer was lost and the SDK retried");
    let lifted = lifted.expect("lifted, not 'not quarantined'");
    assert_eq!((lifted.lease_epoch, lifted.lease_expiry), (quarantined.lease_epoch + 1, T0 + 600_000));
    assert_eq!(direct.get(12).await.unwrap(), Some(lifted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_whose_answer_was_lost_is_applied_once() {
    let (lossy, direct, dropped) = through_proxy(":far").await;
    direct.claim(13, "a", T0, T0 + 300_000).await.unwrap();
    let row = lossy.quarantine(13, "oncall", T0 + 1).await.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "the first answer was lost and the SDK retried");
    assert_eq!((row.lease_epoch, row.expiry_before_quarantine), (2, Some(T0 + 300_000)), "one quarantine: {row:?}");
    assert_eq!(direct.get(13).await.unwrap(), Some(row));
}
