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
