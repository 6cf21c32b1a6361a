//! The CLI as on-call reads it, against a live `idgen up`: every human-readable table has its
//! columns lined up under its headers, every `--json` form parses, `idgen status` shows the
//! platform and exits 1 when something is down, exit codes are the documented ones, and shell
//! completions are generated.

use std::time::Duration;

use idgen_e2e::{idgen, idgen_bin, start_up};
use serde_json::Value;

/// The cells of a table line: separated by two or more spaces, with where each starts and ends.
fn cells(line: &str) -> Vec<(usize, usize)> {
    let mut cells = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !(bytes[i] == b' ' && (i + 1 == bytes.len() || bytes[i + 1] == b' ')) {
            i += 1;
        }
        cells.push((start, i));
    }
    cells
}

/// Finds the table whose header line starts with `first` in `output` and checks that every row's
/// cells sit under the headers: each column is left-aligned (every cell starts where its header
/// does) or right-aligned (every cell ends where its header does). Returns the rows' count.
fn assert_aligned(output: &str, first: &str) -> usize {
    let lines: Vec<&str> = output.lines().collect();
    let at = lines.iter().position(|l| l.starts_with(first)).unwrap_or_else(|| panic!("no table {first}:\n{output}"));
    let header = cells(lines[at]);
    let rows: Vec<&str> = lines[at + 1..].iter().take_while(|l| cells(l).len() > 1).copied().collect();
    assert!(!rows.is_empty(), "table {first} has no rows:\n{output}");
    for (column, (start, end)) in header.iter().enumerate() {
        let cells_of: Vec<(usize, usize)> = rows.iter().filter_map(|row| cells(row).get(column).copied()).collect();
        let left = cells_of.iter().all(|(s, _)| s == start);
        let right = cells_of.iter().all(|(_, e)| e == end);
        assert!(left || right, "column {column} of table {first} is not under its header:\n{output}");
    }
    for row in &rows {
        assert!(cells(row).len() <= header.len(), "a row with more cells than headers:\n{output}");
    }
    rows.len()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn exit_code(args: &[&str], dir: &std::path::Path) -> i32 {
    let output = tokio::process::Command::new(idgen_bin()).args(args).current_dir(dir).output().await.unwrap();
    output.status.code().expect("exited")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_tables_line_up_json_parses_and_status_shows_the_platform() {
    let dir = tempfile::tempdir().unwrap();
    let (mut up, port) = start_up(dir.path(), &[]).await;
    let registry = format!("http://127.0.0.1:{port}");
    let config = dir.path().join(".idgen/us-east-1/worker-1.toml");
    let config = config.to_str().unwrap();
    let state = dir.path().join(".idgen");
    let state = state.to_str().unwrap();

    // Human tables.
    let regions = idgen(&["regions", "list", "--registry", &registry]).await.unwrap();
    assert_eq!(assert_aligned(&regions, "NUMBER"), 1);
    let layouts = idgen(&["layouts", "show", "--registry", &registry]).await.unwrap();
    assert_eq!(assert_aligned(&layouts, "LAYOUT"), 2);
    // The three workers claim within moments of "up".
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let leases = loop {
        let leases = idgen(&["leases", "--config", config, "list"]).await.unwrap();
        if leases.lines().count() >= 4 || tokio::time::Instant::now() > deadline {
            break leases;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(assert_aligned(&leases, "MACHINE"), 3);
    let listed = json(&idgen(&["leases", "--config", config, "--json", "list"]).await.unwrap());
    let machine = listed[0]["machine_id"].as_u64().unwrap().to_string();
    let history = idgen(&["leases", "--config", config, "history", &machine]).await.unwrap();
    assert!(assert_aligned(&history, "AT") >= 1);
    let status = idgen(&["status", "--dir", state]).await.unwrap();
    assert_eq!(assert_aligned(&status, "LAYOUT"), 2);
    assert_eq!(assert_aligned(&status, "NUMBER"), 1);
    assert_eq!(assert_aligned(&status, "REGION "), 3, "{status}");
    assert!(status.contains("all issuing"), "{status}");

    // Every --json form parses.
    assert_eq!(
        json(&idgen(&["regions", "list", "--registry", &registry, "--json"]).await.unwrap())["regions"][0]["name"],
        "us-east-1"
    );
    assert_eq!(
        json(&idgen(&["layouts", "show", "--registry", &registry, "--json"]).await.unwrap())["layouts"][1]["name"],
        "v2"
    );
    assert_eq!(listed.as_array().unwrap().len(), 3);
    let events = json(&idgen(&["leases", "--config", config, "--json", "history", &machine]).await.unwrap());
    assert_eq!(events[0]["event"], "claim");
    let decoded = json(&idgen(&["decode", "97301141913751557", "--json"]).await.unwrap());
    assert_eq!(decoded["layout"], "v1");
    let ids =
        idgen(&["ids", "--url", &format!("http://127.0.0.1:{}", port + 1), "--count", "2", "--json"]).await.unwrap();
    assert_eq!(ids.lines().map(json).filter(|line| line["id"].is_string()).count(), 2, "{ids}");
    let shown = json(&idgen(&["status", "--dir", state, "--json"]).await.unwrap());
    assert_eq!(shown["healthy"], true, "{shown}");
    assert_eq!(shown["workers"].as_array().unwrap().len(), 3);
    assert!(
        shown["workers"].as_array().unwrap().iter().all(|w| w["status"] == "ok" && w["leases"][0]["layout"] == "v1")
    );
    let saved = json(&std::fs::read_to_string(dir.path().join(".idgen/up.json")).unwrap());
    assert_eq!(saved["registry"], registry.as_str());
    let certs =
        json(&idgen(&["dev-certs", "--dir", dir.path().join("certs").to_str().unwrap(), "--json"]).await.unwrap());
    assert!(certs["dir"].as_str().unwrap().ends_with("certs"));

    // Something down: status says so, and exits 1.
    let args = ["status", "--dir", state, "--worker", "us-east-1=http://127.0.0.1:1", "--json"];
    let output = tokio::process::Command::new(idgen_bin()).args(args).output().await.unwrap();
    assert_eq!(output.status.code(), Some(1));
    let shown = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(shown["healthy"], false);
    assert_eq!(shown["workers"][3]["status"], "unreachable");

    // Exit codes: 0 done, 1 refused or not found, 2 usage.
    let here = dir.path();
    assert_eq!(exit_code(&["regions", "list", "--registry", &registry], here).await, 0);
    assert_eq!(exit_code(&["status", "--registry", "http://127.0.0.1:1"], here).await, 1);
    let retire = ["regions", "retire", "no-such-region", "--registry", &registry];
    assert_eq!(exit_code(&[&retire[..], &["--confirm", "no-such-region"]].concat(), here).await, 1);
    assert_eq!(exit_code(&retire, here).await, 2, "--confirm is required");
    assert_eq!(exit_code(&["no-such-command"], here).await, 2);
    assert_eq!(exit_code(&["decode", "not-an-id"], here).await, 2);
    // A registry over plain HTTP beyond loopback: refused before anything is sent (a token or
    // the schedule would cross the network in clear).
    for args in [
        &["regions", "list", "--registry", "http://10.20.30.40:8700"][..],
        &["decode", "97301141913751557", "--registry", "http://registry.example:8700"][..],
    ] {
        assert_eq!(exit_code(args, here).await, 2, "{args:?}");
    }
    assert_eq!(exit_code(&["status", "--dir", state, "--worker", "no-url"], here).await, 2);
    assert_eq!(exit_code(&["leases", "--config", config, "quarantine", "--operator", "me"], here).await, 2);
    let help = idgen(&["--help"]).await.unwrap();
    assert!(help.contains("Exit status") && help.contains("2  usage"), "{help}");

    // Completions.
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef idgen"), ("fish", "complete -c idgen")] {
        let script = idgen(&["completions", shell]).await.unwrap();
        assert!(script.contains(marker) && script.contains("status"), "{shell}: {}", &script[..script.len().min(200)]);
    }
    up.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_up_json_prints_its_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let port = idgen_e2e::up_base_port();
    let mut child = tokio::process::Command::new(idgen_bin())
        .args(["up", "--json", "--base-port", &port.to_string(), "--dir", &dir.path().join(".idgen").to_string_lossy()])
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let summary = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                return value;
            }
        }
        panic!("idgen up --json exited before printing its endpoints");
    })
    .await
    .unwrap();
    assert_eq!(summary["status"], "up");
    assert_eq!(summary["registry"], format!("http://127.0.0.1:{port}"));
    assert_eq!(summary["workers"].as_array().unwrap().len(), 3);
    assert!(summary["workers"].as_array().unwrap().iter().all(|w| w["region"] == "us-east-1"));
    child.kill().await.unwrap();
}
