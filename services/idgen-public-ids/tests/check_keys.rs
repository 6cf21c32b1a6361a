//! `retire-check-key` on SQLite and PostgreSQL: a check key version is retired only when nothing
//! needs it, and, forced, the public IDs made under it keep resolving through the legacy filter.

use idgen_public_ids::check::{Gate, Verdict};
use idgen_public_ids::format::{self, Format, OsRandom};
use idgen_public_ids::store::PublicIdStore;
use idgen_public_ids::store::check::{self, RetiredKey};
use idgen_server::database::Pool;
use idgen_test_support::{TestDatabase as Db, store_suite};

async fn sqlite() -> Db {
    Db::sqlite("public-ids.db")
}

async fn postgres() -> Db {
    Db::postgres("check_keys").await
}

/// Before, a check key could never be retired; now it is refused for the newest version, for one new
/// IDs may still be made under, and (unless forced) for one that tags public IDs; forced, those
/// IDs go into the sealed legacy filter and still resolve, and the version is never reused.
async fn a_check_key_is_retired_only_when_nothing_needs_it(db: Db) {
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    let gate = Gate::new(check::gate_state(store.db()).await.unwrap());
    let now = idgen::system_unix_ms();
    let made = store
        .create_batch(&[1, 2, 3], Format::Opaque, None, &|| gate.new_opaque(&OsRandom, None, now), now)
        .await
        .unwrap();
    let bytes: Vec<[u8; 16]> =
        made.iter().map(|m| format::stored_bytes(Format::Opaque, &m.public_id).unwrap()).collect();
    assert!(bytes.iter().all(|b| b[0] == 1), "made under version 1");
    let pool = Pool::connect_one(db.url()).await.unwrap();

    // Version 2, added long enough ago to be in use on every instance.
    assert_eq!(check::add_check_key(&pool, now - 600_000).await.unwrap(), Some(2));
    let newest = check::retire_check_key(&pool, 2, true, now).await.unwrap_err().to_string();
    assert!(newest.contains("is the newest"), "{newest}");
    assert_eq!(check::retire_check_key(&pool, 1, false, now).await.unwrap(), RetiredKey::InUse { made: 3 });
    let unknown = check::retire_check_key(&pool, 9, true, now).await.unwrap_err().to_string();
    assert!(unknown.contains("no check key version 9"), "{unknown}");
    // Version 3, added now: new IDs may still be made under 2 for a while.
    assert_eq!(check::add_check_key(&pool, now).await.unwrap(), Some(3));
    let early = check::retire_check_key(&pool, 2, false, now).await.unwrap_err().to_string();
    assert!(early.contains("may still be made under check key version 2"), "{early}");
    // Nothing was changed by the refusals.
    assert_eq!(check::check_keys(&pool).await.unwrap().iter().map(|k| k.version).collect::<Vec<_>>(), [1, 2, 3]);

    // Forced: version 1's IDs go into the sealed filter and keep resolving.
    let retired = check::retire_check_key(&pool, 1, true, now).await.unwrap();
    assert_eq!(retired, RetiredKey::Retired { moved: 3, filter_sealed: true });
    assert_eq!(check::check_keys(&pool).await.unwrap().iter().map(|k| k.version).collect::<Vec<_>>(), [2, 3]);
    let after = Gate::new(check::gate_state(store.db()).await.unwrap());
    for (mapping, bytes) in made.iter().zip(&bytes) {
        assert_eq!(after.judge(Format::Opaque, bytes, None), Verdict::Legacy, "{}", mapping.public_id);
        assert_eq!(store.resolve(Format::Opaque, bytes).await.unwrap(), Some((mapping.internal_id, None)));
    }
    // IDs forged under the retired version now pass only the filter's false positives.
    let passed = (0..10_000)
        .filter(|_| {
            let mut forged = [0u8; 16];
            getrandom::fill(&mut forged).unwrap();
            forged[0] = 1;
            after.judge(Format::Opaque, &forged, None) != Verdict::Forged
        })
        .count();
    assert!(passed < 30, "{passed} of 10,000 IDs forged under the retired version passed");
    // A version retired with nothing under it is simply gone; versions are never reused.
    assert_eq!(check::add_check_key(&pool, now - 400_000).await.unwrap(), Some(4));
    assert_eq!(
        check::retire_check_key(&pool, 2, false, now).await.unwrap(),
        RetiredKey::Retired { moved: 0, filter_sealed: true }
    );
    assert_eq!(check::add_check_key(&pool, now).await.unwrap(), Some(5));
    pool.close().await;
}

store_suite!(a_check_key_is_retired_only_when_nothing_needs_it);
