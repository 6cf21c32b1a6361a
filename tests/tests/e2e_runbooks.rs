//! Every command in `runbooks/*.md` (the lines of its ```` ```sh ```` blocks) runs (with bash, `set -eo pipefail`), in order,
//! against a live worker on the DynamoDB-protocol server, with the pages' variables set.

use std::time::Duration;

use idgen_e2e::{
    Issued, Store, WorkerProcess, WorkerSpec, idgen_bin, now_unix_ms, post_ids, shared_dynamodb_endpoint, unique_table,
    v1_fields,
};

fn commands(page: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in page.lines() {
        match line.trim_start() {
            "```sh" => inside = true,
            "```" => inside = false,
            command if inside && !command.is_empty() && !command.starts_with('#') => out.push(command.to_owned()),
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_runbook_commands_run() {
    let client = reqwest::Client::new();
    let spec = WorkerSpec::short_lease_on(
        "runbook",
        Store::Dynamodb { endpoint: shared_dynamodb_endpoint(), table: unique_table("runbook") },
    );
    let worker = WorkerProcess::start(&spec).await.unwrap();
    let machine = worker.wait_ready(&client, Duration::from_secs(10)).await.unwrap();
    let Issued::Ids(ids) = post_ids(&client, &worker.url, 1).await.unwrap() else { panic!("refused") };
    assert_eq!(v1_fields(ids[0]).1, machine);
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();

    let bin_dir = idgen_bin().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let runbooks = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut pages: Vec<_> = std::fs::read_dir(&runbooks).unwrap().map(|e| e.unwrap().path()).collect();
    pages.sort();
    let mut ran = 0;
    for page in pages.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        for command in commands(&std::fs::read_to_string(page).unwrap()) {
            let output = tokio::process::Command::new("bash")
                .arg("-c")
                .arg(format!("set -eo pipefail; {command}"))
                .env("PATH", &path)
                .env("WORKER", &worker.url)
                .env("IDGEN_CONFIG", config.path())
                .env("MACHINE", machine.to_string())
                .env("ID", ids[0].to_string())
                .env("FROM_MS", (now_unix_ms() - 600_000).to_string())
                .env("TO_MS", (now_unix_ms() + 60_000).to_string())
                .output()
                .await
                .unwrap();
            assert!(
                output.status.success(),
                "{}: `{command}` failed:\n{}{}",
                page.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(!output.stdout.is_empty(), "{}: `{command}` printed nothing", page.display());
            ran += 1;
        }
    }
    assert!(ran >= 10, "only {ran} runbook commands found");
    println!("runbooks: {ran} commands ran against a live worker");
    worker.stop().await.unwrap();
}
