//! Every command in the documentation's shell blocks runs: the lines of the ```` ```sh ````
//! blocks of `README.md` and `docs/*.md` (pages in that order, `docs/` by file name; commands in
//! page order), with bash (`set -eo pipefail`), in a fresh directory where `idgen up` runs on its
//! default ports, exactly as the README starts it; ```` ```sh tls ```` blocks run after it, in
//! another fresh directory, against `idgen up --tls`. Each command is followed by one or more
//! `# shows: <text>` lines and its standard output must contain every such text; a command
//! without one fails the test. The blocks are read by `idgen_e2e::shell_steps`, as the runbooks'
//! are (`runbooks.rs`); `docs/proof.md` states the rules for writing them.
//!
//! What a reader has at hand, the directory has too: `idgen` on the `PATH` (the binary the tests
//! start; a command written `cargo run --release -- …` runs it as `idgen …`), `worker.toml`,
//! `registry.toml` and `public-ids.toml` (copies of the files `up` wrote for its first worker,
//! its registry and its public-ID service), `ids.txt` and `export.csv` (IDs the platform issued,
//! one of them twice: a planted duplicate), and `$PUBLIC_ID` (a public ID the service made).

use std::path::{Path, PathBuf};
use std::time::Duration;

use idgen_e2e::{Step, idgen_bin, shell_steps, start_up_on};

/// `idgen up`'s default base port: the registry on 8700, workers 8701–8703, public IDs 8709.
const BASE_PORT: u16 = 8700;

/// The documentation's pages, in the order their commands run.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    [root.join("README.md")].into_iter().chain(docs).collect()
}

/// Fails the test, naming the documented ports, when anything listens on 8700–8713.
fn ports_are_free() {
    for port in BASE_PORT..BASE_PORT + 14 {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken: the documentation's commands run against `idgen up` on its default ports \
             8700-8713 (stop an `idgen up` you are running)"
        );
    }
}

/// SIGINT (Ctrl-C, as the README says) and wait for `up` to stop everything.
async fn stop(mut child: tokio::process::Child) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) };
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "idgen up stopped with {status}");
}

/// Runs `steps` (each with the page it is from) with bash in `dir`, checking every `# shows:`.
async fn run(steps: &[(PathBuf, Step)], dir: &Path, env: &[(&str, String)]) -> usize {
    let bin_dir = idgen_bin().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for (page, Step { line, command, shows, .. }) in steps {
        let at = format!("{}:{line}", page.file_name().unwrap().to_string_lossy());
        assert!(!shows.is_empty(), "{at}: `{command}` has no `# shows:` line");
        let script = match command.strip_prefix("cargo run --release -- ") {
            Some(rest) => format!("idgen {rest}"),
            None => command.clone(),
        };
        let mut bash = tokio::process::Command::new("bash");
        bash.arg("-c").arg(format!("set -eo pipefail; {script}")).current_dir(dir).env("PATH", &path);
        // The reader's shell has none of these; the CLI would take them over its defaults.
        for name in [
            "IDGEN_URL",
            "IDGEN_REGISTRY_URL",
            "IDGEN_PUBLIC_IDS_URL",
            "IDGEN_OPERATOR_TOKEN",
            "IDGEN_CACERT",
            "IDGEN_CERT",
            "IDGEN_KEY",
        ] {
            bash.env_remove(name);
        }
        bash.envs(env.iter().map(|(name, value)| (*name, value.as_str())));
        let output = tokio::time::timeout(Duration::from_secs(30), bash.output())
            .await
            .unwrap_or_else(|_| panic!("{at}: `{command}` did not finish within 30 s"))
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{at}: `{command}` failed ({}):\n{printed}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        for text in shows {
            // `$NAME` in a `# shows:` line is the variable's value, as in the command.
            let text = env.iter().fold(text.clone(), |t, (name, value)| t.replace(&format!("${name}"), value));
            assert!(printed.contains(&text), "{at}: `{command}` does not show {text:?}; it printed:\n{printed}");
        }
    }
    steps.len()
}

/// Waits until the worker at `url` answers `/healthz` 200 `"ok"`, and returns its v1 machine number.
async fn issuing(client: &reqwest::Client, url: &str) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = client.get(format!("{url}/healthz")).send().await
            && response.status() == 200
            && let Ok(health) = response.json::<serde_json::Value>().await
            && health["status"] == "ok"
            && let Some(machine) = health["leases"][0]["machine"].as_u64()
        {
            return machine;
        }
        assert!(tokio::time::Instant::now() < deadline, "{url} is not issuing 30 s after `idgen up`");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies a file `up` wrote to the name the documentation gives it.
fn copy(dir: &Path, from: &str, to: &str) {
    std::fs::copy(dir.join(".idgen").join(from), dir.join(to)).unwrap_or_else(|e| panic!("{from}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_docs_commands_run() {
    let mut plain = Vec::new();
    let mut tls = Vec::new();
    for page in pages() {
        let steps = shell_steps(&std::fs::read_to_string(&page).unwrap())
            .unwrap_or_else(|error| panic!("{}: {error:#}", page.display()));
        for step in steps {
            match step.fence.as_str() {
                "sh" => plain.push((page.clone(), step)),
                "sh tls" => tls.push((page.clone(), step)),
                other => panic!("{}:{}: a ```{other} block: only `sh` and `sh tls` run", page.display(), step.line),
            }
        }
    }
    let started = std::time::Instant::now();
    let client = reqwest::Client::new();

    // `idgen up`, every worker issuing. docs/operating.md quarantines machine number 37 (by
    // number, and as the number of the ID 97301141913751557), and `idgen status` after it must
    // find every worker issuing: a platform whose worker drew 37 is started again.
    let (dir, up) = loop {
        ports_are_free();
        let dir = tempfile::tempdir().unwrap();
        let up = start_up_on(dir.path(), BASE_PORT, &[]).await;
        let mut machines = Vec::new();
        for port in BASE_PORT + 1..=BASE_PORT + 3 {
            machines.push(issuing(&client, &format!("http://127.0.0.1:{port}")).await);
        }
        if !machines.contains(&37) {
            break (dir, up);
        }
        stop(up).await;
    };
    copy(dir.path(), "us-east-1/worker-1.toml", "worker.toml");
    copy(dir.path(), "registry.toml", "registry.toml");
    copy(dir.path(), "public-ids.toml", "public-ids.toml");
    let worker = format!("http://127.0.0.1:{}", BASE_PORT + 1);
    let issued: serde_json::Value = client
        .post(format!("{worker}/v1/ids:batch"))
        .body(r#"{"count": 5}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids: Vec<&str> = issued["ids"].as_array().unwrap().iter().map(|id| id.as_str().unwrap()).collect();
    ids.push(ids[0]);
    std::fs::write(dir.path().join("ids.txt"), ids.join("\n") + "\n").unwrap();
    let csv: String = ids.iter().enumerate().map(|(row, id)| format!("{row},order-{row},{id}\n")).collect();
    std::fs::write(dir.path().join("export.csv"), format!("row,name,id\n{csv}")).unwrap();
    let made: serde_json::Value = client
        .post(format!("http://127.0.0.1:{}/v1/public-ids", BASE_PORT + 9))
        .body(r#"{"internal_id": "97301141913751557"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let public_id = made["public_id"].as_str().unwrap_or_else(|| panic!("no public ID: {made}")).to_owned();
    let ran = run(&plain, dir.path(), &[("PUBLIC_ID", public_id)]).await;
    stop(up).await;

    // `idgen up --tls`, for the blocks that need its certificates.
    let dir = tempfile::tempdir().unwrap();
    ports_are_free();
    let up = start_up_on(dir.path(), BASE_PORT, &["--tls"]).await;
    let tls_files = dir.path().join(".idgen/tls");
    let read = |name: &str| std::fs::read(tls_files.join(name)).unwrap();
    let orders = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&read("ca.pem")).unwrap())
        .identity(reqwest::Identity::from_pem(&[read("orders.pem"), read("orders-key.pem")].concat()).unwrap())
        .build()
        .unwrap();
    issuing(&orders, &format!("https://127.0.0.1:{}", BASE_PORT + 1)).await;
    let ran_tls = run(&tls, dir.path(), &[]).await;
    stop(up).await;

    assert!(ran >= 30 && ran_tls >= 2, "only {ran} + {ran_tls} documented commands found");
    println!(
        "documentation: {ran} commands ran against `idgen up`, {ran_tls} against `idgen up --tls` ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}
