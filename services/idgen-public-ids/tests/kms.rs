//! The encrypted format's data keys through KMS, against a KMS-protocol server on loopback
//! (moto, started by ./scripts/test: IDGEN_DYNAMODB_ENDPOINT serves KMS too). A data key is
//! generated once, stored only wrapped, unwrapped at every start; a new version encrypts while
//! the old one still resolves.

use idgen_public_ids::kms;
use idgen_public_ids::store::PublicIdStore;

#[tokio::test]
async fn data_keys_are_generated_wrapped_unwrapped_and_rotated() {
    let endpoint = std::env::var("IDGEN_DYNAMODB_ENDPOINT")
        .expect("IDGEN_DYNAMODB_ENDPOINT is not set: this test needs the KMS-protocol server ./scripts/test starts");
    let settings = idgen::dynamodb::AwsSettings { endpoint: Some(endpoint), ..Default::default() }.patient();
    let client = kms::client(&settings).await;
    let key_id = client.create_key().description("idgen public IDs (test)").send().await.unwrap();
    let key_id = key_id.key_metadata().unwrap().key_id().to_owned();

    let metrics = kms::KmsMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let dir = tempfile::tempdir().unwrap();
    // A key KMS does not know: no data key is made, and the service must not start with none
    // (it would have nothing to encrypt with).
    let empty = PublicIdStore::connect(&format!("sqlite://{}", dir.path().join("none.db").display())).await.unwrap();
    assert!(kms::init_keys(&empty, &client, "no-such-key", &metrics).await.is_err());
    assert!(kms::load_keyring(&empty, &client, "no-such-key", &[], &metrics).await.is_err());
    assert!(empty.wrapped_keys().await.unwrap().is_empty());

    // Loading never makes a key: `init` (idgen public init) does, once.
    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let store = PublicIdStore::connect(&url).await.unwrap();
    let error = kms::load_keyring(&store, &client, &key_id, &[], &metrics).await.unwrap_err();
    assert!(format!("{error:#}").contains("idgen public init"), "{error:#}");
    assert_eq!(kms::init_keys(&store, &client, &key_id, &metrics).await.unwrap(), Some(1));
    assert_eq!(kms::init_keys(&store, &client, &key_id, &metrics).await.unwrap(), None);
    let keyring = kms::load_keyring(&store, &client, &key_id, &[], &metrics).await.unwrap();
    assert_eq!(keyring.versions(), vec![1]);
    let stored = store.wrapped_keys().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_ne!(stored[0].2.len(), 32, "only the wrapped form is stored");
    let v1 = keyring.encrypt(4242).unwrap();

    // A restart unwraps the same key: earlier public IDs still resolve.
    drop(keyring);
    let restarted =
        kms::load_keyring(&PublicIdStore::connect(&url).await.unwrap(), &client, &key_id, &[], &metrics).await.unwrap();
    assert_eq!(restarted.decrypt(&v1), Some(4242));
    assert_eq!(restarted.encrypt(4242).unwrap(), v1);

    // Rotation adds version 2: it encrypts, version 1 still resolves.
    assert_eq!(kms::add_key_version(&store, &client, &key_id, &metrics).await.unwrap(), 2);
    let rotated = kms::load_keyring(&store, &client, &key_id, &[], &metrics).await.unwrap();
    // Moved to a new KMS key: the old versions are refused until the old key is listed as a
    // previous one (the database is not trusted to name the key KMS decrypts with).
    let moved = client.create_key().description("idgen public IDs (test, moved)").send().await.unwrap();
    let moved = moved.key_metadata().unwrap().key_id().to_owned();
    let error = kms::load_keyring(&store, &client, &moved, &[], &metrics).await.unwrap_err();
    assert!(format!("{error:#}").contains("previous_key_ids"), "{error:#}");
    let both = kms::load_keyring(&store, &client, &moved, std::slice::from_ref(&key_id), &metrics).await.unwrap();
    assert_eq!(both.decrypt(&v1), Some(4242));
    assert_eq!(rotated.versions(), vec![1, 2]);
    let v2 = rotated.encrypt(4242).unwrap();
    assert_ne!(v2, v1);
    assert_eq!((rotated.decrypt(&v1), rotated.decrypt(&v2)), (Some(4242), Some(4242)));
    // Every call is counted by operation and outcome, as /metrics shows them.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for (operation, outcome, count) in [
        ("generate_data_key", "error", 1),
        ("generate_data_key", "ok", 2),
        ("decrypt", "ok", 6),
        ("decrypt", "error", 0),
    ] {
        let series =
            format!("idgen_public_kms_calls_total{{operation=\"{operation}\",outcome=\"{outcome}\"}} {count}\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
    println!("kms: key {key_id}: version 1 generated and unwrapped across a restart, version 2 added, both resolve");
}
