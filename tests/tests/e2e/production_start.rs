//! A production registry or public-ID service never starts over: through the real binary, on
//! real PostgreSQL databases (and KMS from moto), each refuses to start (exit status 2) on an
//! empty database, another service's database, or one that names another home region, printing
//! the command to run; `idgen registry init` / `idgen public init` make a new database theirs,
//! once, and change nothing when run again; and a public-ID service whose database lost its data
//! keys refuses rather than make a new version 1 (under which every encrypted public ID already
//! given out would answer 404). Each service runs as a role of its own, granted by `init
//! --owner-url` only what it uses; the schema is the owner's. Left out of the configuration, or
//! on SQLite, each is refused before it opens anything, naming every key (the unit tests of each
//! config, and e2e_infra_config).

use std::path::Path;
use std::process::Output;

use idgen_e2e::{idgen_bin, shared_dynamodb_endpoint, start_idgen};
use idgen_server::pki::DevCa;
use idgen_test_support::TestDatabase;

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `idgen <args>`, to its end.
async fn run(args: &[&str]) -> Output {
    tokio::process::Command::new(idgen_bin()).args(args).env("RUST_LOG", "warn").output().await.unwrap()
}

/// A production `[tls]` section (mutual TLS) with a development CA's files in `dir`.
fn tls_section(dir: &Path) -> String {
    let ca = DevCa::new("idgen production-start test CA").unwrap();
    std::fs::write(dir.join("ca.pem"), ca.ca_pem()).unwrap();
    ca.server(&["127.0.0.1", "localhost"]).unwrap().write(dir, "server").unwrap();
    format!(
        "[tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\nmetrics_readers = [\"spiffe://idgen.test/host/scraper\"]\n",
        dir.join("server.pem"),
        dir.join("server-key.pem"),
        dir.join("ca.pem")
    )
}

fn registry_config(dir: &Path, url: &str, home: &str) -> String {
    let path = dir.join(format!("registry-{home}.toml"));
    let operators = DevCa::new("idgen production-start operator CA").unwrap();
    std::fs::write(dir.join("operators-ca.pem"), operators.ca_pem()).unwrap();
    let text = format!(
        "listen = \"127.0.0.1:0\"\ndatabase_url = \"{url}\"\nhome_region = \"{home}\"\ncertificate_operators = \
         [\"spiffe://idgen.internal/operator/ops-oncall\"]\n{}operator_ca = {:?}\n",
        tls_section(dir),
        dir.join("operators-ca.pem")
    );
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Starting `args` ends at once with exit status 2 and says `expected`.
async fn refused(args: &[&str], expected: &[&str]) {
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run(args)).await.expect("it did not end");
    assert_eq!(out.status.code(), Some(2), "idgen {args:?} was not refused:\n{}", text(&out));
    for said in expected {
        assert!(text(&out).contains(said), "idgen {args:?} does not say {said:?}:\n{}", text(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_production_registry_starts_only_on_its_initialized_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::postgres("registry").await;
    // The registry runs as a role of its own; the schema is the owner's (the server's admin here).
    let runtime = db.login_role().await;
    let config = registry_config(dir.path(), &runtime, "us-east-1");

    // Empty: refused, the command to run printed, and nothing made in the database.
    refused(&["registry", "--config", &config], &["the database is empty", "idgen registry init"]).await;
    let standalone = idgen_bin().with_file_name("idgen-registry");
    let out = tokio::process::Command::new(&standalone).args(["--config", &config]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(2), "idgen-registry:\n{}", text(&out));
    let tables: i64 = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(tables, 0, "a refused start created tables");

    // init as the role the registry runs as: it may not create the schema.
    let out = run(&["registry", "init", "--config", &config]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("permission denied"), "{}", text(&out));
    // init as the owner, granting the runtime role: once it publishes, again it changes nothing.
    let out = run(&["registry", "init", "--config", &config, "--owner-url", db.url(), "--json"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((said["initialized"].as_bool(), said["home_region"].as_str()), (Some(true), Some("us-east-1")));
    let out = run(&["registry", "init", "--config", &config, "--owner-url", db.url()]).await;
    assert!(out.status.success() && text(&out).contains("already a registry's"), "{}", text(&out));

    // Initialized: it serves (mutual TLS) as the runtime role, its horizon writer included.
    let (mut child, url) =
        start_idgen(&["registry", "--config", &config], &[], "idgen-registry listening on ").await.unwrap();
    assert!(url.starts_with("https://"), "{url}");
    child.kill().await.unwrap();

    // The same database under a configuration naming another home region: refused by both.
    let other = registry_config(dir.path(), db.url(), "eu-west-1");
    refused(&["registry", "--config", &other], &["home region us-east-1", "eu-west-1"]).await;
    let out = run(&["registry", "init", "--config", &other]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("never changes once published"), "{}", text(&out));

    // Another service's database (the public-ID service's tables): refused by both.
    let foreign = TestDatabase::postgres("registry").await;
    let public = dir.path().join("public-ids.toml");
    std::fs::write(
        &public,
        format!("development = true\ndatabase_url = \"{}\"\nformats = [\"opaque\"]\n", foreign.url()),
    )
    .unwrap();
    assert!(run(&["public", "init", "--config", public.to_str().unwrap()]).await.status.success());
    let wrong = registry_config(dir.path(), foreign.url(), "ap-south-1");
    refused(&["registry", "--config", &wrong], &["not the registry's", "public_ids"]).await;
    let out = run(&["registry", "init", "--config", &wrong]).await;
    assert!(!out.status.success() && text(&out).contains("not the registry's"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_production_public_id_service_never_makes_a_data_key_itself() {
    let settings =
        idgen::DynamoDbSettings { endpoint: Some(shared_dynamodb_endpoint()), ..Default::default() }.patient();
    let kms = idgen_public_ids::kms::client(&settings).await;
    let key = kms.create_key().description("idgen production-start e2e").send().await.unwrap();
    let key_id = key.key_metadata().unwrap().key_id().to_owned();

    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::postgres("public").await;
    let runtime = db.login_role().await;
    let config = dir.path().join("public-ids.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\n[kms]\nkey_id = \"{key_id}\"\nendpoint = \"{}\"\n{}",
            runtime,
            shared_dynamodb_endpoint(),
            tls_section(dir.path())
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();

    refused(&["public", "serve", "--config", config], &["the database is empty", "idgen public init"]).await;

    let out = run(&["public", "init", "--config", config, "--owner-url", db.url(), "--json"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["key_version_made"], 1);
    let out = run(&["public", "init", "--config", config, "--owner-url", db.url(), "--json"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["key_version_made"].is_null());

    let (mut child, url) =
        start_idgen(&["public", "serve", "--config", config], &[], "idgen-public-ids listening on ").await.unwrap();
    assert!(url.starts_with("https://"), "{url}");
    child.kill().await.unwrap();

    // The data keys gone (a restore that missed a table, a hand edit): refused, never a new key.
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
        sqlx::query("DELETE FROM public_id_keys").execute(&mut conn).await.unwrap();
    }
    refused(&["public", "serve", "--config", config], &["no data key", "idgen public init"]).await;

    // A stored key wrapped under a KMS key the configuration does not name: refused, KMS not asked.
    assert!(run(&["public", "init", "--config", config, "--owner-url", db.url()]).await.status.success());
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
        sqlx::query("UPDATE public_id_keys SET kms_key_id = 'arn:aws:kms:us-east-1:999999999999:key/someone-else'")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    refused(&["public", "serve", "--config", config], &["someone-else", "previous_key_ids"]).await;
}
