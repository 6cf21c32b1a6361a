//! Many processes opening one fresh SQLite file at the same moment — what `idgen up`, a systemd
//! template unit or a test harness does — all start: workers on one lease file, registries and
//! public-ID services on one database file each.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

const PROCESSES: usize = 8;

/// Starts `PROCESSES` copies of `idgen <args>` at once and waits for each to print `ready` on
/// stdout (it is then killed) or, with `ready` empty, to exit 0. The errors of those that did not.
async fn all_start(args: &[&str], ready: &str) -> Vec<String> {
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(idgen_e2e::idgen_bin())
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawning idgen")
        })
        .collect();
    let waits = children.into_iter().map(|mut child| {
        let ready = ready.to_owned();
        tokio::spawn(async move {
            let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut stderr = child.stderr.take().unwrap();
            let outcome = tokio::time::timeout(Duration::from_secs(60), async {
                if !ready.is_empty() {
                    while let Ok(Some(line)) = stdout.next_line().await {
                        if line.contains(&ready) {
                            return Ok(());
                        }
                    }
                }
                let status = child.wait().await.unwrap();
                let mut text = String::new();
                stderr.read_to_string(&mut text).await.unwrap();
                if status.success() && ready.is_empty() { Ok(()) } else { Err(format!("{status}: {text}")) }
            })
            .await;
            let _ = child.kill().await;
            outcome.unwrap_or_else(|_| Err("neither ready nor exited within 60 s".into()))
        })
    });
    let mut errors = Vec::new();
    for wait in waits {
        if let Err(error) = wait.await.unwrap() {
            errors.push(error);
        }
    }
    errors
}

fn write(path: &Path, text: String) -> String {
    std::fs::write(path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_eight_workers_open_one_fresh_lease_file_at_once() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let config = write(
            &dir.path().join("worker.toml"),
            format!(
                "development = true\nlisten = \"127.0.0.1:0\"\nschedule_cache = {:?}\n\
                 [lease]\nstore = \"sqlite\"\ncreate_tables = true\nsqlite_path = {:?}\n[clock]\nrequire_sync = false\n",
                dir.path().join("schedule.json").display().to_string(),
                dir.path().join("leases.db").display().to_string()
            ),
        );
        let errors = all_start(&["worker", "--config", &config], "idgen-worker listening on ").await;
        assert!(
            errors.is_empty(),
            "round {round}: {} of {PROCESSES} workers failed to open the lease file: {errors:#?}",
            errors.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_eight_registries_and_public_id_services_open_one_fresh_file_at_once() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let registry = write(
            &dir.path().join("registry.toml"),
            format!(
                "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\nhome_region = \"home\"\n",
                dir.path().join("registry.db").display()
            ),
        );
        let errors = all_start(&["registry", "--config", &registry], "idgen-registry listening on ").await;
        assert!(errors.is_empty(), "round {round}: {} registries failed to open their file: {errors:#?}", errors.len());

        let public = write(
            &dir.path().join("public-ids.toml"),
            format!(
                "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\n",
                dir.path().join("public.db").display()
            ),
        );
        let errors = all_start(&["public", "serve", "--config", &public], "idgen-public-ids listening on ").await;
        assert!(
            errors.is_empty(),
            "round {round}: {} public-ID services failed to open their file: {errors:#?}",
            errors.len()
        );
    }
}
