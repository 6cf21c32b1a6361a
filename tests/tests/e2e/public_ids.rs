//! The public-ID service as a real process, with its data key from KMS (moto on loopback):
//! `idgen public create|resolve`, typed public IDs (`[types]`), idempotency under 32 concurrent
//! creates, and a forged ID.

use std::time::Duration;

use idgen_e2e::{idgen, shared_dynamodb_endpoint, start_public_ids};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_public_ids_through_the_binary() {
    let settings =
        idgen_aws::AwsSettings { endpoint: Some(shared_dynamodb_endpoint()), ..Default::default() }.patient();
    let kms = idgen_public_ids::kms::client(&settings).await;
    let key = kms.create_key().description("idgen e2e").send().await.unwrap();
    let key_id = key.key_metadata().unwrap().key_id().to_owned();

    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\n[kms]\nkey_id = \"{key_id}\"\nendpoint = \"{}\"\n\
         [types]\norder = {{ number = 1 }}\nuser = {{ number = 2, format = \"uuidv7\" }}\n",
        dir.path().join("p.db").display(),
        shared_dynamodb_endpoint()
    );
    let (mut child, url) = start_public_ids(dir.path(), &text).await.unwrap();
    let config = dir.path().join("public-ids.toml");

    for format in ["opaque", "uuidv7", "encrypted"] {
        let public =
            idgen(&["public", "create", "--url", &url, "97301141913751557", "--format", format]).await.unwrap();
        let public = public.trim();
        assert!(!public.is_empty() && !public.contains("97301141913751557"), "{format}: {public}");
        let internal = idgen(&["public", "resolve", "--url", &url, public]).await.unwrap();
        assert_eq!(internal.trim(), "97301141913751557", "{format}");
    }

    // Typed: `order_…` and `user_…` (a UUIDv7's TypeID), which resolve with their prefix only.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    for public_type in ["order", "user"] {
        let public = idgen(&["public", "create", "--url", &url, "31337", "--type", public_type]).await.unwrap();
        let public = public.trim();
        let (prefix, _) = idgen_public_ids::format::parse_typeid(public).unwrap_or_else(|| panic!("{public}"));
        assert_eq!(prefix, public_type);
        let internal = idgen(&["public", "resolve", "--url", &url, public]).await.unwrap();
        assert_eq!(internal.trim(), "31337", "{public_type}");
        let untyped = &public[public_type.len() + 1..];
        let response = http.get(format!("{url}/v1/public-ids/{untyped}")).send().await.unwrap();
        assert_eq!(response.status(), 404, "{public} without its type");
    }
    let refused = idgen(&["public", "create", "--url", &url, "31337", "--type", "ghost"]).await.unwrap_err();
    assert!(format!("{refused:#}").contains("unknown type"), "{refused:#}");

    // 32 concurrent creates of one internal ID: one mapping, every caller gets it.
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                let response = http
                    .post(format!("{url}/v1/public-ids"))
                    .json(&serde_json::json!({"internal_id": "555"}))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                let body: serde_json::Value = response.json().await.unwrap();
                (status, body["public_id"].as_str().unwrap().to_owned())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(answers.iter().filter(|(status, _)| *status == 201).count(), 1, "{answers:?}");
    assert!(answers.iter().all(|(status, id)| (*status == 200 || *status == 201) && *id == answers[0].1));

    // A flipped character in an encrypted ID resolves to 404.
    let encrypted = idgen(&["public", "create", "--url", &url, "4242", "--format", "encrypted"]).await.unwrap();
    let mut forged: Vec<char> = encrypted.trim().chars().collect();
    let i = forged.len() / 2;
    forged[i] = if forged[i] == 'q' { 'r' } else { 'q' };
    let forged: String = forged.into_iter().collect();
    let response = http.get(format!("{url}/v1/public-ids/{forged}")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    // The start-up's KMS calls, on /metrics: one data key generated, one unwrapped.
    let metrics = http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    for series in [
        r#"idgen_public_kms_calls_total{operation="generate_data_key",outcome="ok"} 1"#,
        r#"idgen_public_kms_calls_total{operation="decrypt",outcome="ok"} 1"#,
        r#"idgen_public_kms_calls_total{operation="decrypt",outcome="error"} 0"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics:\n{metrics}");
    }
    // A new data-key version, as JSON.
    let rotated = idgen(&["public", "rotate-key", "--config", config.to_str().unwrap(), "--json"]).await.unwrap();
    let rotated: serde_json::Value = serde_json::from_str(rotated.trim()).unwrap();
    assert_eq!(
        (rotated["key_version"].as_u64(), rotated["restart_needed"].as_bool()),
        (Some(2), Some(true)),
        "{rotated}"
    );
    println!(
        "public IDs: three formats and two types round-tripped through `idgen public`, 32 concurrent creates agreed, a \
         forged ID was 404"
    );
    child.kill().await.unwrap();
}

/// The value of the series `name{labels}` on a `/metrics` page.
fn series(text: &str, name: &str) -> f64 {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

/// The keyed check through the real binary and its commands, on PostgreSQL: `idgen public init`
/// of a new database seals an empty filter (a forged opaque ID is read nowhere); on a database
/// holding a mapping from before check keys (its filter open), that untagged ID resolves and
/// every untagged ID is read; `idgen public seal-legacy` puts it in the filter, after which it
/// still resolves and a forged one is turned away without a read; `idgen public rotate-check-key`
/// adds version 2, which new IDs carry only two minutes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_the_keyed_check_through_the_commands() {
    use idgen_public_ids::format::{crockford_decode_16, crockford_encode};
    let db = idgen_test_support::TestDatabase::postgres("public_check").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("public-ids.toml");
    std::fs::write(
        &config,
        format!(
            "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\nformats = [\"opaque\"]\n",
            db.url()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    idgen(&["public", "init", "--config", config]).await.unwrap();
    let owner = sqlx::PgPool::connect(db.url()).await.unwrap();
    let sealed: bool =
        sqlx::query_scalar("SELECT sealed FROM public_id_legacy_filter").fetch_one(&owner).await.unwrap();
    assert!(sealed, "a database init made new has nothing from before: its filter is sealed, empty");
    // As a database from before check keys: the filter open, and an untagged mapping.
    sqlx::query("UPDATE public_id_legacy_filter SET sealed = false, bits = ''::BYTEA").execute(&owner).await.unwrap();
    let old = rand::random::<[u8; 16]>();
    sqlx::query("INSERT INTO public_ids_opaque (internal_id, public_id) VALUES (7, $1)")
        .bind(sqlx::types::Uuid::from_bytes(old))
        .execute(&owner)
        .await
        .unwrap();
    let (old, forged) = (crockford_encode(&old), crockford_encode(&rand::random::<[u8; 16]>()));
    let client = reqwest::Client::new();
    let resolve = |url: String, id: String| {
        let client = client.clone();
        async move { client.get(format!("{url}/v1/public-ids/{id}")).send().await.unwrap().status().as_u16() }
    };
    let checks = |url: String| {
        let client = client.clone();
        async move {
            let text = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
            ["legacy", "forged"]
                .map(|v| series(&text, &format!("idgen_public_resolve_checks_total{{verdict=\"{v}\"}}")))
        }
    };

    let (mut service, url) = start_public_ids(dir.path(), &std::fs::read_to_string(config).unwrap()).await.unwrap();
    assert_eq!(resolve(url.clone(), old.clone()).await, 200, "an untagged ID from before resolves");
    assert_eq!(resolve(url.clone(), forged.clone()).await, 404);
    assert_eq!(checks(url.clone()).await, [2.0, 0.0], "open: both untagged IDs were read");
    service.kill().await.unwrap();

    let sealed = idgen(&["public", "seal-legacy", "--config", config, "--json"]).await.unwrap();
    let sealed: serde_json::Value = serde_json::from_str(&sealed).unwrap();
    assert_eq!((sealed["read"].as_u64(), sealed["untagged"].as_u64()), (Some(1), Some(1)), "{sealed}");
    let rotated = idgen(&["public", "rotate-check-key", "--config", config, "--json"]).await.unwrap();
    let rotated: serde_json::Value = serde_json::from_str(&rotated).unwrap();
    assert_eq!(rotated["check_key_version"], 2, "{rotated}");

    let (_service, url) = start_public_ids(dir.path(), &std::fs::read_to_string(config).unwrap()).await.unwrap();
    assert_eq!(resolve(url.clone(), old.clone()).await, 200, "sealed, the ID from before still resolves");
    let forged_twice = crockford_encode(&rand::random::<[u8; 16]>());
    assert_eq!(resolve(url.clone(), forged_twice).await, 404);
    let [legacy, forged] = checks(url.clone()).await;
    assert_eq!((legacy, forged), (1.0, 1.0), "sealed: the old ID read, the forged one turned away");
    let made = client.post(format!("{url}/v1/public-ids")).json(&serde_json::json!({"internal_id": "8"})).send();
    let made: serde_json::Value = made.await.unwrap().json().await.unwrap();
    let made = made["public_id"].as_str().unwrap().to_owned();
    assert_eq!(crockford_decode_16(&made).unwrap()[0], 1, "version 2 tags new IDs only two minutes after rotation");
    assert_eq!(resolve(url.clone(), made).await, 200);
}
