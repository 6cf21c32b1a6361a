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
    let renewed = store.renew(7, "a", a.lease_epoch, t0 + 10_000, t0 + 500, t0 + 500).await;
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

/// Runs `child` in a forked process and returns whether it exited 0.
fn in_a_forked_child(child: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs `child` on a runtime of its own and leaves with `_exit`, without
    // unwinding into the parent's state.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn a_process_forked_while_the_file_is_open_is_refused_it_and_one_forked_after_close_is_not() {
    // A forked child's SQLite took no real lock on the file its parent had open; the
    // parent's close then deleted the WAL the child renewed its lease in.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let other = dir.path().join("other.db");
    let rt = runtime();
    let store = rt.block_on(SqliteLeaseStore::open(&path, "idgen-leases")).unwrap();
    let refused = in_a_forked_child(|| {
        let rt = runtime();
        let same = rt.block_on(SqliteLeaseStore::open(&path, "idgen-leases"));
        let forked = matches!(&same, Err(idgen::StoreError::Forked(why)) if why.contains("post-fork hook") && why.contains("spawn"));
        // Another file is the child's own: its SQLite has no record of it.
        let own = rt.block_on(SqliteLeaseStore::open(&other, "idgen-leases")).is_ok();
        forked && own
    });
    assert!(refused, "the child opened the file its parent has open, or could not open its own");
    rt.block_on(store.close());
    // Closed means closed: no descriptor of the file is left for a child to inherit.
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let target = std::fs::read_link(entry.unwrap().path()).unwrap_or_default();
        assert!(!target.to_string_lossy().contains("leases.db"), "still open after close: {}", target.display());
    }
    let opened = in_a_forked_child(|| match runtime().block_on(SqliteLeaseStore::open(&path, "idgen-leases")) {
        Ok(_) => true,
        Err(error) => {
            eprintln!("the second child: {error}");
            false
        }
    });
    assert!(opened, "a child forked after the parent closed the file was refused it");
}
