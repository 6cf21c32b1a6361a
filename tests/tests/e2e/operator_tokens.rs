//! Operator tokens as an operator meets them: `idgen registry token` makes one and prints its
//! hash, the registry's configuration holds only hashes, a write with the token lands in the
//! audit under its operator's name, a token removed from the configuration stops working at the
//! next SIGHUP, and a configuration holding a token in clear, or one token for two operators, is
//! refused: at start, and at a reload (the operators in force then stay).

use std::time::{Duration, Instant};

use anyhow::Context;
use idgen_e2e::{idgen, idgen_bin, start_idgen};
use serde_json::Value;

struct Made {
    token: String,
    line: String,
}

async fn token(name: &str) -> Made {
    let made: Value =
        serde_json::from_str(&idgen(&["registry", "token", "--name", name, "--json"]).await.unwrap()).unwrap();
    assert_eq!(made["name"], name);
    let (token, hash) = (made["token"].as_str().unwrap(), made["hash"].as_str().unwrap());
    assert!(token.starts_with("idgen_op_") && token.len() == 9 + 64, "{made}");
    assert!(hash.starts_with("sha256:") && hash.len() == 7 + 64 && !hash.contains(token), "{made}");
    assert_eq!(made["config"].as_str().unwrap(), format!("{name} = \"{hash}\""));
    Made { token: token.to_owned(), line: made["config"].as_str().unwrap().to_owned() }
}

fn config(dir: &std::path::Path, operators: &[&str]) -> String {
    format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\nhome_region = \"us-east-1\"\n\
         [operators]\n{}\n",
        dir.join("registry.db").display(),
        operators.join("\n")
    )
}

async fn add_region(client: &reqwest::Client, url: &str, token: &str, name: &str) -> u16 {
    let response = client
        .post(format!("{url}/v1/regions"))
        .bearer_auth(token)
        .json(&serde_json::json!({"name": name}))
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

#[tokio::test]
async fn the_configuration_holds_hashes_a_removed_token_stops_at_sighup_and_a_shared_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.toml");
    let (alice, bob) = (token("alice").await, token("bob").await);
    assert_ne!(alice.token, bob.token);

    // The human-readable form prints the token once and the line for [operators].
    let text = idgen(&["registry", "token", "--name", "carol"]).await.unwrap();
    assert!(text.contains("idgen_op_") && text.contains("carol = \"sha256:"), "{text}");
    let bad_name =
        std::process::Command::new(idgen_bin()).args(["registry", "token", "--name", "a b"]).output().unwrap();
    assert_eq!(bad_name.status.code(), Some(2), "{bad_name:?}");

    std::fs::write(&path, config(dir.path(), &[&alice.line])).unwrap();
    let (mut registry, url) =
        start_idgen(&["registry", "--config", path.to_str().unwrap()], &[], "idgen-registry listening on ")
            .await
            .unwrap();
    let client = reqwest::Client::new();
    assert_eq!(add_region(&client, &url, &alice.token, "us-east-1").await, 201);
    assert_eq!(add_region(&client, &url, &bob.token, "eu-west-1").await, 401, "bob is not configured yet");
    let hash_of_alice = alice.line.split('"').nth(1).unwrap();
    assert_eq!(add_region(&client, &url, hash_of_alice, "eu-west-1").await, 401, "the hash is not the token");

    // Alice leaves, Bob arrives: a SIGHUP later her token no longer writes, his does.
    std::fs::write(&path, config(dir.path(), &[&bob.line])).unwrap();
    let pid = registry.id().context("pid").unwrap() as i32;
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while add_region(&client, &url, &bob.token, "eu-west-1").await != 201 {
        assert!(Instant::now() < deadline, "bob's token never started to work after SIGHUP");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(add_region(&client, &url, &alice.token, "ap-south-1").await, 401, "alice's token was removed");
    let audit: Value =
        client.get(format!("{url}/v1/audit")).bearer_auth(&bob.token).send().await.unwrap().json().await.unwrap();
    let operators: Vec<&str> =
        audit["writes"].as_array().context("writes").unwrap().iter().filter_map(|e| e["actor"].as_str()).collect();
    assert!(operators.contains(&"alice") && operators.contains(&"bob"), "{audit}");

    // A reload that would give two operators one token is refused; Bob's token still works.
    let shared = bob.line.replacen("bob", "mallory", 1);
    std::fs::write(&path, config(dir.path(), &[&bob.line, &shared])).unwrap();
    unsafe { libc::kill(pid, libc::SIGHUP) };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(add_region(&client, &url, &bob.token, "ap-south-1").await, 201, "the operators in force stay");
    registry.kill().await.unwrap();

    // At start: one token for two operators, and a token in clear, each refused with what to do.
    for (operators, says) in [
        (vec![bob.line.clone(), shared], "have the same token"),
        (vec![format!("bob = \"{}\"", bob.token)], "operators.bob is not a token hash"),
    ] {
        let lines: Vec<&str> = operators.iter().map(String::as_str).collect();
        std::fs::write(&path, config(dir.path(), &lines)).unwrap();
        let output = std::process::Command::new(idgen_bin())
            .args(["registry", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(says), "{says}: {output:?}");
    }
}
