//! The lease-store conformance suite on the SQLite backend: each test its own file.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use idgen::lease::conformance::StoreFactory;
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

    async fn quarantine_by_hand(&self, machine: u32) {
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", self.path.display())).await.unwrap();
        sqlx::query(
            r#"UPDATE "idgen-leases" SET holder = 'QUARANTINED', lease_expiry = 4102444800000,
                      lease_epoch = lease_epoch + 1 WHERE machine_id = ?"#,
        )
        .bind(machine)
        .execute(&pool)
        .await
        .unwrap();
    }
}

async fn factory() -> SqliteFactory {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leases.db");
    SqliteFactory { _dir: dir, path }
}

idgen::lease_store_conformance!(factory);

/// A lease lost while the audit log cannot be written must still come back as lost: the keeper
/// stops issuing on `ConditionFailed`, but keeps issuing until its fence on `Unavailable`. Before,
/// a failed audit insert turned the first into the second, and a taken-over holder kept issuing.
#[tokio::test]
async fn a_lost_renewal_is_reported_lost_even_when_its_audit_record_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteLeaseStore::open(&path, "idgen-leases").await.unwrap();
    let t0 = 1_790_424_000_000;
    let a = match store.claim(7, "a", t0, t0 + 1_000).await.unwrap() {
        idgen::ClaimOutcome::Claimed(row) => row,
        other => panic!("{other:?}"),
    };
    assert!(matches!(store.claim(7, "b", t0 + 1_001, t0 + 5_000).await.unwrap(), idgen::ClaimOutcome::Claimed(_)));
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::raw_sql(
        r#"CREATE TRIGGER no_audit BEFORE INSERT ON "idgen-leases-audit"
           BEGIN SELECT RAISE(FAIL, 'audit log unwritable'); END;"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    let renewed = store.renew(7, "a", a.lease_epoch, t0 + 10_000, t0 + 500).await;
    assert_eq!(renewed, Ok(idgen::Conditional::ConditionFailed));
}

/// A lease file made before claim tokens and kept quarantine expiries opens and works.
#[tokio::test]
async fn a_lease_file_from_before_claim_tokens_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display())).await.unwrap();
    sqlx::raw_sql(
        r#"CREATE TABLE "idgen-leases" (machine_id INTEGER PRIMARY KEY, holder TEXT NOT NULL,
               lease_expiry INTEGER NOT NULL, lease_epoch INTEGER NOT NULL);
           INSERT INTO "idgen-leases" VALUES (3, 'old/pid-1/1', 100, 4);"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let stores = futures_open(&path).await;
    let row = stores[0].get(3).await.unwrap().unwrap();
    assert_eq!((row.lease_epoch, row.claim_token, row.expiry_before_quarantine), (4, None, None));
    let claimed = stores[1].claim(3, "new", 1_000, 2_000).await.unwrap();
    assert!(matches!(claimed, idgen::ClaimOutcome::Claimed(row) if row.lease_epoch == 5 && row.claim_token.is_some()));
}

/// Several handles open the old file at once; each adds the missing columns or finds them added.
async fn futures_open(path: &std::path::Path) -> Vec<SqliteLeaseStore> {
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let path = path.to_owned();
            tokio::spawn(async move { SqliteLeaseStore::open(&path, "idgen-leases").await.unwrap() })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap());
    }
    stores
}
