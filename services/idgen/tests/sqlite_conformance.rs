//! The lease-store conformance suite on the SQLite backend: each test its own file.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use idgen::conformance::StoreFactory;
use idgen::{LeaseStore, SqliteLeaseStore};

struct SqliteFactory {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(SqliteLeaseStore::open(&self.path, "idgen-leases").await.expect("open sqlite lease store"))
    }
}

async fn factory() -> SqliteFactory {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leases.db");
    SqliteFactory { _dir: dir, path }
}

idgen::lease_store_conformance!(factory);
