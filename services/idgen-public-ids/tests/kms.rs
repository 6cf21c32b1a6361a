//! The encrypted format's data keys through KMS, against a KMS-protocol server on loopback
//! (moto, started by ./scripts/test: IDGEN_DYNAMODB_ENDPOINT serves KMS too). A data key is
//! generated once, stored only wrapped, unwrapped at every start; a new version encrypts while
//! the old one still resolves.

use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use idgen_public_ids::format::Keyring;
use idgen_public_ids::kms;
use idgen_public_ids::store::PublicIdStore;
use zeroize::Zeroizing;

async fn kms_client() -> aws_sdk_kms::Client {
    let endpoint = std::env::var("IDGEN_DYNAMODB_ENDPOINT")
        .expect("IDGEN_DYNAMODB_ENDPOINT is not set: this test needs the KMS-protocol server ./scripts/test starts");
    let settings = idgen_aws::AwsSettings { endpoint: Some(endpoint), ..Default::default() }.patient();
    kms::client(&settings).await
}

#[tokio::test]
async fn data_keys_are_generated_wrapped_unwrapped_and_rotated() {
    let client = kms_client().await;
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
    assert_ne!(stored[0].wrapped.len(), 32, "only the wrapped form is stored");
    assert!(stored[0].with_context);
    // KMS unwraps it only under its encryption context: without one, or as another version, no.
    let bare = client.decrypt().key_id(&key_id).ciphertext_blob(Blob::new(stored[0].wrapped.clone())).send().await;
    assert!(bare.is_err(), "a stored key unwrapped without its encryption context");
    let mut as_v2 = client.decrypt().key_id(&key_id).ciphertext_blob(Blob::new(stored[0].wrapped.clone()));
    for (name, value) in kms::encryption_context(2) {
        as_v2 = as_v2.encryption_context(name, value);
    }
    assert!(as_v2.send().await.is_err(), "version 1's key unwrapped as version 2");
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

    // The probe asks what a start asks: Decrypt of every stored version. It succeeds while KMS
    // answers, and fails (counted, idgen_public_kms_up 0) when a version's key cannot decrypt.
    metrics.register_probe(&mut registry);
    let probe = kms::KmsProbe::new(client.clone(), store.wrapped_keys().await.unwrap());
    assert!(probe.check(&metrics).await);
    let mut gone = store.wrapped_keys().await.unwrap();
    gone[0].kms_key_id = "11111111-2222-3333-4444-555555555555".into();
    assert!(!kms::KmsProbe::new(client.clone(), gone).check(&metrics).await, "a key KMS does not know decrypted");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for series in [
        "idgen_public_kms_up 0\n",
        "idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"ok\"} 9\n",
        "idgen_public_kms_calls_total{operation=\"decrypt\",outcome=\"error\"} 1\n",
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
    println!("kms: key {key_id}: version 1 generated and unwrapped across a restart, version 2 added, both resolve");
}

/// A data key made before keys were wrapped under an encryption context: the service refuses to
/// start on it, and `init` re-wraps it (KMS ReEncrypt) so that every public ID it made still
/// resolves, now unwrapped only under its context.
#[tokio::test]
async fn a_key_wrapped_without_a_context_is_refused_until_init_rewraps_it() {
    let client = kms_client().await;
    let key = client.create_key().description("idgen public IDs (legacy test)").send().await.unwrap();
    let key_id = key.key_metadata().unwrap().key_id().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let store = PublicIdStore::connect(&url).await.unwrap();

    // Version 1 as an earlier release made it: no encryption context.
    let legacy = client.generate_data_key().key_id(&key_id).key_spec(DataKeySpec::Aes256).send().await.unwrap();
    let plain = Zeroizing::new(legacy.plaintext().unwrap().as_ref().to_vec());
    let given_out = Keyring::new(vec![(1, plain)]).unwrap().encrypt(4242).unwrap();
    {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO public_id_keys (version, kms_key_id, wrapped_key, created_at_ms) VALUES (1, $1, $2, 0)",
        )
        .bind(&key_id)
        .bind(legacy.ciphertext_blob().unwrap().as_ref().to_vec())
        .execute(&mut conn)
        .await
        .unwrap();
    }
    assert!(!store.wrapped_keys().await.unwrap()[0].with_context, "the migration marks old keys");

    let metrics = kms::KmsMetrics::default();
    let error = kms::load_keyring(&store, &client, &key_id, &[], &metrics).await.unwrap_err();
    assert!(format!("{error:#}").contains("idgen public init"), "{error:#}");
    assert_eq!(kms::init_keys(&store, &client, &key_id, &metrics).await.unwrap(), None, "no new version");
    let stored = store.wrapped_keys().await.unwrap();
    assert_eq!((stored.len(), stored[0].version, stored[0].with_context), (1, 1, true));
    let keyring = kms::load_keyring(&store, &client, &key_id, &[], &metrics).await.unwrap();
    assert_eq!(keyring.decrypt(&given_out), Some(4242), "a public ID given out before still resolves");
    let bare = client.decrypt().key_id(&key_id).ciphertext_blob(Blob::new(stored[0].wrapped.clone())).send().await;
    assert!(bare.is_err(), "the re-wrapped key unwraps without its context");
    // init again: nothing left to re-wrap.
    assert_eq!(kms::init_keys(&store, &client, &key_id, &metrics).await.unwrap(), None);
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("idgen_public_kms_calls_total{operation=\"re_encrypt\",outcome=\"ok\"} 1\n"), "{text}");
}
