//! Every command in `runbooks/*.md` (the lines of its ```` ```sh ```` blocks) runs (with bash,
//! `set -eo pipefail`), in order, against a live worker on the DynamoDB-protocol server, with the
//! pages' variables set; and prints what the page says it shows: each command is followed by
//! one or more `# shows: <text>` lines, and its output must contain every such text (with the
//! variables substituted). A command without one fails the test: a page may not promise nothing.
//! The blocks are read by `idgen_e2e::shell_steps`, as the documentation's are (`docs.rs`).

use std::time::Duration;

use idgen_e2e::{
    Issued, Step, Store, WorkerProcess, WorkerSpec, idgen_bin, now_unix_ms, post_ids, shared_dynamodb_endpoint,
    shell_steps, unique_table, v1_fields,
};

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

    // The restore page's new table, and the configuration naming it instead.
    let Store::Dynamodb { endpoint, table } = &spec.store else { unreachable!() };
    let new_table = format!("{table}-restored");
    let new_config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    let new_spec =
        WorkerSpec { store: Store::Dynamodb { endpoint: endpoint.clone(), table: new_table.clone() }, ..spec.clone() };
    std::fs::write(new_config.path(), new_spec.toml()).unwrap();

    let bin_dir = idgen_bin().parent().unwrap().to_path_buf();
    // The pinned AWS CLI (./scripts/test installs it) for the pages' `aws dynamodb` commands.
    let aws = std::env::var("IDGEN_AWS_CLI").expect("IDGEN_AWS_CLI is not set (./scripts/test installs the AWS CLI)");
    let aws_dir = std::path::Path::new(&aws).parent().unwrap().to_path_buf();
    let path = format!("{}:{}:{}", bin_dir.display(), aws_dir.display(), std::env::var("PATH").unwrap_or_default());
    let runbooks = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut pages: Vec<_> = std::fs::read_dir(&runbooks).unwrap().map(|e| e.unwrap().path()).collect();
    pages.sort();
    // A file of IDs in which the worker's ID appears twice: the planted duplicate.
    let ids_file = tempfile::NamedTempFile::new().unwrap();
    let more = post_ids(&client, &worker.url, 1).await.unwrap();
    let Issued::Ids(more) = more else { panic!("refused") };
    std::fs::write(ids_file.path(), format!("{}\n{}\n{}\n", ids[0], more[0], ids[0])).unwrap();
    let variables = [
        ("WORKER", worker.url.clone()),
        ("IDGEN_CONFIG", config.path().display().to_string()),
        ("MACHINE", machine.to_string()),
        ("ID", ids[0].to_string()),
        ("IDS_FILE", ids_file.path().display().to_string()),
        // Longest first: `$LEASE_TABLE` is a prefix of nothing else, `$NEW_LEASE_TABLE` is not.
        ("NEW_LEASE_TABLE", new_table.clone()),
        ("NEW_IDGEN_CONFIG", new_config.path().display().to_string()),
        ("LEASE_TABLE", table.clone()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ];
    let substitute = |text: &str| {
        variables.iter().fold(text.to_owned(), |t, (name, value)| {
            t.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value)
        })
    };
    let mut ran = 0;
    for page in pages.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let steps = shell_steps(&std::fs::read_to_string(page).unwrap())
            .unwrap_or_else(|error| panic!("{}: {error:#}", page.display()));
        for Step { fence, command, shows, .. } in steps {
            assert_eq!(fence, "sh", "{}: `{command}`: a runbook's blocks run against its one worker", page.display());
            let output = tokio::process::Command::new("bash")
                .arg("-c")
                .arg(format!("set -eo pipefail; {command}"))
                .env("PATH", &path)
                .env("WORKER", &worker.url)
                .env("IDGEN_CONFIG", config.path())
                .env("MACHINE", machine.to_string())
                .env("ID", ids[0].to_string())
                .env("IDS_FILE", ids_file.path())
                .env("LEASE_TABLE", table)
                .env("NEW_LEASE_TABLE", &new_table)
                .env("NEW_IDGEN_CONFIG", new_config.path())
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ENDPOINT_URL", endpoint)
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
            assert!(!shows.is_empty(), "{}: `{command}` has no `# shows:` line", page.display());
            let printed = String::from_utf8_lossy(&output.stdout);
            for text in shows.iter().map(|t| substitute(t)) {
                assert!(
                    printed.contains(&text),
                    "{}: `{command}` does not show {text:?}; it printed:\n{printed}",
                    page.display()
                );
            }
            ran += 1;
        }
    }
    assert!(ran >= 10, "only {ran} runbook commands found");
    println!("runbooks: {ran} commands ran against a live worker");
    worker.stop().await.unwrap();
}
