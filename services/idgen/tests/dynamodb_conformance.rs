//! The lease-store conformance suite on DynamoDB, against a DynamoDB-protocol server on loopback
//! (moto, started by ./scripts/test, which exports IDGEN_DYNAMODB_ENDPOINT). Each test uses its
//! own freshly created tables. Unreachable server: the tests fail, they never skip. Credentials
//! come from the environment (./scripts/test exports dummy ones the local server accepts).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use idgen::lease::conformance::StoreFactory;
use idgen::{DynamoDbLeaseStore, DynamoDbSettings, LeaseStore};

struct DynamoFactory {
    settings: DynamoDbSettings,
    table: String,
}

#[async_trait]
impl StoreFactory for DynamoFactory {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let client = idgen::lease::dynamodb::client(&self.settings).await;
        Arc::new(DynamoDbLeaseStore::new(client, &self.table))
    }

    async fn quarantine_by_hand(&self, machine: u32) {
        // The design notes' command 3, through the SDK.
        use aws_sdk_dynamodb::types::AttributeValue;
        idgen::lease::dynamodb::client(&self.settings)
            .await
            .update_item()
            .table_name(&self.table)
            .key("machine_id", AttributeValue::N(machine.to_string()))
            .update_expression("SET #h = :q, lease_expiry = :far ADD lease_epoch :one")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_values(":q", AttributeValue::S("QUARANTINED".into()))
            .expression_attribute_values(":far", AttributeValue::N("4102444800000".into()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
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
    let store = DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, &table);
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
    let lossy = DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, &factory.table);
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
    let lift = idgen::Lift { min_expiry_unix_ms: T0 + 600_000, holder_stopped: false };
    let lifted = lossy.release_quarantine(12, "oncall", lift, T0 + 2).await.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "the first answer was lost and the SDK retried");
    let idgen::LiftOutcome::Lifted(lifted) = lifted else { panic!("lifted, not {lifted:?}") };
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

/// The audit table is deleted mid-run: every lease change still applies at once, its record
/// waits fsynced in the spool, and once the table is back every record is in it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_table_deleted_mid_run_loses_no_record() {
    use idgen::{AuditKind, ClaimOutcome, Conditional};
    let factory = factory().await;
    let client = idgen::lease::dynamodb::client(&factory.settings).await;
    let dir = tempfile::tempdir().unwrap();
    let store = DynamoDbLeaseStore::new(client.clone(), &factory.table).with_audit_spool(dir.path()).unwrap();
    let spool = store.audit_spool().unwrap().clone();
    let start = idgen::system_unix_ms();
    let claim = |machine: u32| {
        let store = store.clone();
        async move {
            let now = idgen::system_unix_ms();
            match store.claim(machine, "h", now, now + 60_000).await.unwrap() {
                ClaimOutcome::Claimed(row) => row,
                other => panic!("claim of {machine}: {other:?}"),
            }
        }
    };
    claim(1).await; // written to the table as usual
    assert_eq!(spool.waiting(), 0);

    client.delete_table().table_name(store.audit_table()).send().await.unwrap();
    let outage = std::time::Instant::now();
    for machine in 2..5 {
        let row = claim(machine).await;
        let now = idgen::system_unix_ms();
        assert_eq!(store.release(machine, "h", row.lease_epoch, now + 1, now).await.unwrap(), Conditional::Applied);
    }
    store.quarantine(9, "oncall", idgen::system_unix_ms()).await.unwrap();
    let now = idgen::system_unix_ms();
    let lift = idgen::Lift { min_expiry_unix_ms: now + 1_000, holder_stopped: false };
    assert!(matches!(store.release_quarantine(9, "oncall", lift, now).await.unwrap(), idgen::LiftOutcome::Lifted(_)));
    // 3 claims, 3 releases, a quarantine and its lift: each applied, each record on disk.
    assert_eq!(spool.waiting(), 8);
    let on_disk: usize = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().lines().count())
        .sum();
    assert_eq!(on_disk, 8);
    // Only the first record paid the table's timeout; the rest went straight to the spool.
    println!("8 changes during the outage took {:?}", outage.elapsed());

    store.create_tables().await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while spool.waiting() > 0 {
        assert!(std::time::Instant::now() < deadline, "{} records still waiting", spool.waiting());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let events = store.history(None, start - 1, idgen::system_unix_ms() + 1).await.unwrap();
    let mut seen: Vec<(u32, AuditKind)> = events.iter().map(|e| (e.machine_id, e.kind)).collect();
    seen.sort_by_key(|(machine, kind)| (*machine, kind.as_str()));
    let mut expected = vec![(1, AuditKind::Claim)];
    for machine in 2..5 {
        expected.extend([(machine, AuditKind::Claim), (machine, AuditKind::Release)]);
    }
    expected.extend([(9, AuditKind::Quarantine), (9, AuditKind::ReleaseQuarantine)]);
    expected.sort_by_key(|(machine, kind)| (*machine, kind.as_str()));
    // The first claim's record is the only one written before the outage; the table was
    // recreated empty, so it is gone with it — what the spool promised is everything after.
    expected.retain(|(machine, _)| *machine != 1);
    assert_eq!(seen, expected);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a written spool file is removed");
}

/// An audit record is never written over: a record replayed from the spool under
/// a key the table already holds (its first write went through, its answer was lost) leaves the
/// stored one as it is, and counts as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_record_is_never_written_over() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use idgen::ClaimOutcome;
    let factory = factory().await;
    let client = idgen::lease::dynamodb::client(&factory.settings).await;
    let dir = tempfile::tempdir().unwrap();
    let store = DynamoDbLeaseStore::new(client.clone(), &factory.table).with_audit_spool(dir.path()).unwrap();
    let now = idgen::system_unix_ms();
    assert!(matches!(store.claim(3, "h", now, now + 60_000).await.unwrap(), ClaimOutcome::Claimed(_)));
    let items = || async {
        let scanned = client.scan().table_name(store.audit_table()).send().await.unwrap();
        scanned.items.unwrap_or_default()
    };
    let written = items().await;
    assert_eq!(written.len(), 1, "{written:?}");
    let Some(AttributeValue::S(key)) = written[0].get("event_key") else { panic!("{written:?}") };

    let spool = store.audit_spool().unwrap().clone();
    let forged = idgen::lease::audit_spool::SpooledRecord {
        machine_id: 3,
        event_key: key.clone(),
        event: "release".into(),
        holder: "someone-else".into(),
        lease_epoch: 99,
        lease_expiry: 0,
        at_unix_ms: now,
    };
    spool.append(&forged).unwrap();
    assert_eq!(spool.replay().await.unwrap(), 1, "the replay is done");
    assert_eq!(spool.waiting(), 0);
    assert_eq!(items().await, written, "the stored record was written over");
}
