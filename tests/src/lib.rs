//! Harness for the end-to-end tests: start the real `idgen` binary as worker processes, talk to
//! them over loopback HTTP, and break them with real signals.
//!
//! The binary is the one `cargo build --workspace --bins` put beside the test executable
//! (`./scripts/test` builds it first).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `target/<profile>/idgen`, next to `target/<profile>/deps/<this test>`.
pub fn idgen_bin() -> PathBuf {
    workspace_bin("idgen")
}

/// `target/<profile>/<name>`: `idgen`, or a service's own binary (`idgen-worker`,
/// `idgen-registry`, `idgen-public-ids`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
    let bin = profile_dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (./scripts/test does)",
        bin.display()
    );
    bin
}

/// Which lease table a worker uses.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(PathBuf),
    /// A DynamoDB-protocol endpoint and a table name (created by the worker if missing).
    Dynamodb {
        endpoint: String,
        table: String,
    },
}

/// Settings for one worker process, written to its TOML file.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub name: String,
    pub store: Store,
    /// Extra environment for the process (e.g. libfaketime).
    pub env: Vec<(String, String)>,
    /// Extra top-level TOML lines (e.g. `registry_url = "…"`, `region = "…"`).
    pub extra: String,
    /// Extra TOML sections, appended last (e.g. `[tls]`, `[quotas]`).
    pub sections: String,
    pub lease_ms: i64,
    pub renew_interval_ms: i64,
    pub fence_ms: i64,
    pub machines: (u32, u32),
    pub max_backoff_ms: i64,
    /// `lease.dynamodb.audit_spool` (default: beside the schedule copy).
    pub audit_spool: Option<PathBuf>,
    /// `lease.dynamodb.region` (default: the development default, us-east-1).
    pub dynamodb_region: Option<String>,
    /// `lease.create_tables` (default on: a test's tables are its own, made at the worker's start).
    pub create_tables: bool,
}

impl WorkerSpec {
    /// A short test lease (3 s, renewed every second, 500 ms fence) on a shared SQLite file.
    pub fn short_lease(name: &str, sqlite_path: &Path) -> Self {
        Self::short_lease_on(name, Store::Sqlite(sqlite_path.into()))
    }

    pub fn short_lease_on(name: &str, store: Store) -> Self {
        WorkerSpec {
            name: name.into(),
            store,
            env: Vec::new(),
            extra: String::new(),
            sections: String::new(),
            lease_ms: 3_000,
            renew_interval_ms: 1_000,
            fence_ms: 500,
            machines: (0, 63),
            max_backoff_ms: 500,
            audit_spool: None,
            dynamodb_region: None,
            create_tables: true,
        }
    }

    pub fn toml(&self) -> String {
        let create = if self.create_tables { "create_tables = true\n" } else { "" };
        let store = match &self.store {
            Store::Sqlite(path) => {
                format!(
                    "store = \"sqlite\"\n{create}sqlite_path = {}\n",
                    serde_json::to_string(&path.to_string_lossy()).unwrap()
                )
            }
            Store::Dynamodb { table, .. } => format!(
                "store = \"dynamodb\"\n{create}tables = {{ v1 = {t}, v2 = {t2} }}\n",
                t = serde_json::to_string(table).unwrap(),
                t2 = serde_json::to_string(&format!("{table}-v2")).unwrap(),
            ),
        };
        let dynamodb = match &self.store {
            Store::Dynamodb { endpoint, .. } => format!(
                "[lease.dynamodb]\nendpoint = {}\nattempt_timeout_ms = 500\noperation_timeout_ms = 1000\nmax_attempts = 2\n{}{}",
                serde_json::to_string(endpoint).unwrap(),
                self.audit_spool.as_ref().map_or_else(String::new, |dir| format!(
                    "audit_spool = {}\n",
                    serde_json::to_string(&dir.to_string_lossy()).unwrap()
                )),
                self.dynamodb_region.as_ref().map_or_else(String::new, |region| format!(
                    "region = {}\n",
                    serde_json::to_string(region).unwrap()
                )),
            ),
            Store::Sqlite(_) => String::new(),
        };
        format!(
            "development = true\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 2000\n{extra}\n\
             [lease]\n{store}lease_ms = {lease}\nrenew_interval_ms = {renew}\n\
             fence_ms = {fence}\nfirst_machine = {first}\nlast_machine = {last}\nmax_backoff_ms = {backoff}\n\
             {dynamodb}[clock]\nrequire_sync = false\n{sections}",
            lease = self.lease_ms,
            renew = self.renew_interval_ms,
            fence = self.fence_ms,
            first = self.machines.0,
            last = self.machines.1,
            backoff = self.max_backoff_ms,
            sections = self.sections,
            extra = if self.extra.contains("region =") {
                self.extra.clone()
            } else {
                format!("region = \"test-region\"\n{}", self.extra)
            },
        )
    }
}

/// `idgen worker --config <spec>` run to its exit (at most 20 s): its status and standard error;
/// `None` if it was still running then (it is killed).
pub async fn worker_exit(spec: &WorkerSpec) -> Option<(std::process::ExitStatus, String)> {
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), spec.toml()).unwrap();
    let run = Command::new(idgen_bin())
        .args(["worker", "--config", config.path().to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(20), run).await.ok()?.unwrap();
    Some((output.status, String::from_utf8_lossy(&output.stderr).into_owned()))
}

/// A running `idgen worker` process.
pub struct WorkerProcess {
    pub name: String,
    pub url: String,
    /// The plain health listener's URL, with `health_listen` set.
    pub health_url: Option<String>,
    pub child: Child,
    _config: tempfile::NamedTempFile,
}

impl WorkerProcess {
    pub async fn start(spec: &WorkerSpec) -> anyhow::Result<WorkerProcess> {
        let config = tempfile::Builder::new().suffix(".toml").tempfile()?;
        std::fs::write(config.path(), spec.toml())?;
        let (child, line) = start_idgen_line(
            &["worker", "--config", config.path().to_str().context("config path")?],
            &spec.env,
            "idgen-worker listening on ",
        )
        .await?;
        let (url, health_url) = urls_of(&line)?;
        Ok(WorkerProcess { name: spec.name.clone(), url, health_url, child, _config: config })
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("worker is running") as i32
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: sends a signal to our own child process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// SIGSTOP, then wait until every thread of the process is really stopped. Delivery is
    /// asynchronous: on a busy machine the other threads keep running user code for a few
    /// milliseconds until the thread that takes the signal starts the group stop.
    pub async fn freeze(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if all_threads_stopped(self.pid())? {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{} did not stop within 10 s of SIGSTOP", self.name);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// SIGTERM and wait: the worker finishes in-flight requests and releases its lease.
    pub async fn stop(mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        Ok(tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.context("worker did not stop")??)
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self, client: &reqwest::Client) -> anyhow::Result<String> {
        Ok(client.get(format!("{}/metrics", self.url)).send().await?.text().await?)
    }

    pub async fn health(&self, client: &reqwest::Client) -> anyhow::Result<(u16, Value)> {
        let response = client.get(format!("{}/healthz", self.url)).send().await?;
        Ok((response.status().as_u16(), response.json().await?))
    }

    /// Polls `/healthz` until it answers 200, and returns the v1 machine number it holds.
    pub async fn wait_ready(&self, client: &reqwest::Client, within: Duration) -> anyhow::Result<u32> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok((200, body)) = self.health(client).await
                && let Some(machine) = body["leases"][0]["machine"].as_u64()
            {
                return Ok(machine as u32);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{} not ready within {within:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A client trusting `dir/ca.pem` and presenting `dir/<name>.pem` with `dir/<name>-key.pem` (as
/// `idgen_server::pki::Issued::write` leaves them), with a 10 s timeout.
pub fn client_of(dir: &Path, name: &str) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    let mut pem = std::fs::read(dir.join(format!("{name}.pem"))).unwrap();
    pem.extend(std::fs::read(dir.join(format!("{name}-key.pem"))).unwrap());
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `idgen public serve` with `config` (TOML), written to `public-ids.toml` in `dir`; waits until
/// it listens, and returns it with its URL.
pub async fn start_public_ids(dir: &Path, config: &str) -> anyhow::Result<(Child, String)> {
    let path = dir.join("public-ids.toml");
    std::fs::write(&path, config)?;
    let path = path.to_str().context("config path")?;
    start_idgen(&["public", "serve", "--config", path], &[], "idgen-public-ids listening on ").await
}

/// Starts `idgen <args>` and waits for the line `<ready><url> …` on its stdout.
pub async fn start_idgen(args: &[&str], env: &[(String, String)], ready: &str) -> anyhow::Result<(Child, String)> {
    let (child, line) = start_idgen_line(args, env, ready).await?;
    Ok((child, urls_of(&line)?.0))
}

/// The service's URL and its health listener's (` health=<url>`), from the rest of its start-up line.
pub fn urls_of(line: &str) -> anyhow::Result<(String, Option<String>)> {
    let url = line.split_whitespace().next().context("no URL on the start-up line")?.to_owned();
    let health = line.split_whitespace().find_map(|word| word.strip_prefix("health=")).map(str::to_owned);
    Ok((url, health))
}

/// Starts `idgen <args>`, waits for the line `<ready>…` on its stdout, and returns what follows
/// `<ready>` on it.
pub async fn start_idgen_line(args: &[&str], env: &[(String, String)], ready: &str) -> anyhow::Result<(Child, String)> {
    start_idgen_without(args, env, &[], ready).await
}

/// [`start_idgen_line`], with the variables `remove` taken out of what the process inherits.
pub async fn start_idgen_without(
    args: &[&str],
    env: &[(String, String)],
    remove: &[&str],
    ready: &str,
) -> anyhow::Result<(Child, String)> {
    let mut command = Command::new(idgen_bin());
    for name in remove {
        command.env_remove(name);
    }
    let mut child = command
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning idgen {args:?}"))?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = ready.to_owned();
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(&ready) {
                return Ok::<_, std::io::Error>(Some(rest.to_owned()));
            }
        }
        Ok(None)
    })
    .await
    .context("did not start within 30 s")??
    .with_context(|| format!("idgen {args:?} exited before listening"))?;
    // Keep draining stdout so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, line))
}

/// A running `idgen registry` process.
pub struct RegistryProcess {
    pub url: String,
    /// The plain health listener's URL, with `health_listen` set.
    pub health_url: Option<String>,
    pub child: Child,
    pub token: String,
    _config: tempfile::NamedTempFile,
    _dir: tempfile::TempDir,
}

impl RegistryProcess {
    /// A registry on a fresh SQLite file; `extra` adds TOML lines (e.g. `initial_v2_from_ms`).
    pub async fn start(extra: &str) -> anyhow::Result<RegistryProcess> {
        Self::start_on(None, extra).await
    }

    /// A registry on `database_url` (development mode initializes it), or on a fresh SQLite file.
    pub async fn start_on(database_url: Option<&str>, extra: &str) -> anyhow::Result<RegistryProcess> {
        Self::start_at("127.0.0.1:0", database_url, extra).await
    }

    /// [`Self::start_on`], listening on `listen` (a registry started again at the URL its
    /// generators follow).
    pub async fn start_at(listen: &str, database_url: Option<&str>, extra: &str) -> anyhow::Result<RegistryProcess> {
        let dir = tempfile::tempdir()?;
        let database_url = database_url
            .map_or_else(|| format!("sqlite://{}", dir.path().join("registry.db").display()), str::to_owned);
        // The operator's token as an operator gets one: from `idgen registry token`, its hash in
        // the configuration.
        let made: Value = serde_json::from_str(&idgen(&["registry", "token", "--name", "e2e", "--json"]).await?)?;
        let (token, line) =
            (made["token"].as_str().context("token")?.to_owned(), made["config"].as_str().context("config")?);
        let config = tempfile::Builder::new().suffix(".toml").tempfile()?;
        std::fs::write(
            config.path(),
            format!(
                "development = true\nlisten = \"{listen}\"\ndatabase_url = \"{database_url}\"\nhome_region = \"us-east-1\"\n{extra}\n[operators]\n{line}\n",
            ),
        )?;
        let (child, line) = start_idgen_line(
            &["registry", "--config", config.path().to_str().context("path")?],
            &[],
            "idgen-registry listening on ",
        )
        .await?;
        let (url, health_url) = urls_of(&line)?;
        Ok(RegistryProcess { url, health_url, child, token, _config: config, _dir: dir })
    }

    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, "the registry", signal);
    }

    /// The configuration file it reads (again on SIGHUP).
    pub fn config_path(&self) -> &Path {
        self._config.path()
    }

    pub async fn add_region(&self, client: &reqwest::Client, name: &str) -> anyhow::Result<u32> {
        self.add_region_with_tables(client, name, &[]).await
    }

    /// [`Self::add_region`], naming the region's lease tables (`(layout, table)`) where not the
    /// defaults.
    pub async fn add_region_with_tables(
        &self,
        client: &reqwest::Client,
        name: &str,
        tables: &[(&str, &str)],
    ) -> anyhow::Result<u32> {
        let tables: serde_json::Map<String, Value> =
            tables.iter().map(|(layout, table)| ((*layout).to_owned(), Value::from(*table))).collect();
        let response = client
            .post(format!("{}/v1/regions", self.url))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "name": name, "lease_tables": tables }))
            .send()
            .await?;
        anyhow::ensure!(response.status() == 201, "adding {name}: {}", response.status());
        let body: Value = response.json().await?;
        Ok(body["number"].as_u64().context("number")? as u32)
    }
}

/// True when every task in `/proc/<pid>/task` is in state `T` (stopped).
fn all_threads_stopped(pid: i32) -> anyhow::Result<bool> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("stat"))?;
        // The state follows the parenthesised command name, which may itself contain spaces.
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        if state != Some('T') {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What one issuing request came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    Ids(Vec<u64>),
    Refused { status: u16, code: String },
}

pub async fn post_ids(client: &reqwest::Client, url: &str, count: u32) -> anyhow::Result<Issued> {
    let response = if count == 1 {
        client.post(format!("{url}/v1/ids")).send().await?
    } else {
        client.post(format!("{url}/v1/ids:batch")).json(&serde_json::json!({ "count": count })).send().await?
    };
    let status = response.status().as_u16();
    let body: Value = response.json().await?;
    if status != 200 {
        return Ok(Issued::Refused { status, code: body["error"]["code"].as_str().unwrap_or("").to_owned() });
    }
    let ids = if count == 1 {
        let id: u64 = body["id"].as_str().context("id")?.parse()?;
        anyhow::ensure!(body["id_num"].as_u64() == Some(id), "id and id_num disagree: {body}");
        vec![id]
    } else {
        body["ids"]
            .as_array()
            .context("ids")?
            .iter()
            .map(|v| Ok(v.as_str().context("id")?.parse()?))
            .collect::<anyhow::Result<_>>()?
    };
    Ok(Issued::Ids(ids))
}

/// v1 fields: (Unix ms, machine, sequence).
pub fn v1_fields(id: u64) -> (i64, u32, u32) {
    ((id >> 22) as i64 + 1_767_225_600_000, ((id >> 12) & 0x3ff) as u32, (id & 0xfff) as u32)
}

/// Panics with the first repeated ID (decoded) if any ID appears twice; returns the count checked.
pub fn assert_no_duplicates(ids: &mut [u64]) -> usize {
    ids.sort_unstable();
    if let Some(pair) = ids.windows(2).find(|w| w[0] == w[1]) {
        let (ms, machine, sequence) = v1_fields(pair[0]);
        panic!("duplicate ID {} (Unix ms {ms}, machine {machine}, sequence {sequence})", pair[0]);
    }
    ids.len()
}

/// The shared DynamoDB-protocol server `./scripts/test` started. Missing: the test fails.
pub fn shared_dynamodb_endpoint() -> String {
    std::env::var("IDGEN_DYNAMODB_ENDPOINT")
        .expect("IDGEN_DYNAMODB_ENDPOINT is not set: run the tests through ./scripts/test, which starts moto")
}

/// A table name no other test uses.
pub fn unique_table(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A moto server of a test's own, so the test can stop it (SIGSTOP) without disturbing others.
pub struct MotoServer {
    pub endpoint: String,
    child: Child,
}

impl MotoServer {
    pub async fn start() -> anyhow::Result<MotoServer> {
        let python =
            std::env::var("IDGEN_MOTO_PYTHON").context("IDGEN_MOTO_PYTHON is not set (./scripts/test sets it)")?;
        let script =
            std::env::var("IDGEN_MOTO_SCRIPT").context("IDGEN_MOTO_SCRIPT is not set (./scripts/test sets it)")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(python)
            .arg(script)
            .arg("--host")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting moto")?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while client.get(format!("{endpoint}/moto-api/")).send().await.is_err() {
            if tokio::time::Instant::now() > deadline {
                bail!("moto did not start on {endpoint}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(MotoServer { endpoint, child })
    }

    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, "moto", signal);
    }
}

/// Sends `signal` to `child` (`what`, for the message), which must still be running.
fn signal_child(child: &Child, what: &str, signal: i32) {
    let pid = child.id().unwrap_or_else(|| panic!("{what} is not running")) as i32;
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid}, {signal}) of {what}");
}

/// Runs the `idgen` binary with arguments and returns its stdout (fails on a non-zero exit).
pub async fn idgen(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(idgen_bin()).args(args).output().await?;
    if !output.status.success() {
        bail!("idgen {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Unix ms by this process's clock.
pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The lease table a worker with this store uses, opened from the test (for audit checks).
pub async fn open_store(store: &Store) -> anyhow::Result<std::sync::Arc<dyn idgen::LeaseStore>> {
    Ok(match store {
        Store::Sqlite(path) => std::sync::Arc::new(idgen::SqliteLeaseStore::open(path, "idgen-leases").await?),
        Store::Dynamodb { endpoint, table } => {
            let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint.clone()), ..Default::default() };
            std::sync::Arc::new(idgen::DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, table))
        }
    })
}

/// A command of a page's shell blocks, and the texts its standard output must contain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The line of the page the command starts on (from 1).
    pub line: usize,
    /// The block's info string: `sh`, or `sh <word>` for a block that names what it runs against.
    pub fence: String,
    pub command: String,
    pub shows: Vec<String>,
}

/// The commands of `page`'s ```` ```sh ```` blocks (and ```` ```sh <word> ```` blocks), in page
/// order: every line that is neither blank nor a comment is a command (a line ending in `\`
/// goes on on the next one), and each `# shows: <text>` line after it adds a text the command's
/// output must contain. Other comment lines are for the reader. Blocks with any other info
/// string (```` ```text ````, ```` ```toml ````, …) are not read. `# shows:` before any command
/// of a block is an error.
pub fn shell_steps(page: &str) -> anyhow::Result<Vec<Step>> {
    let mut fence: Option<String> = None;
    let mut out: Vec<Step> = Vec::new();
    let mut continued = false;
    // The index in `out` of the current block's first command.
    let mut block_start = 0;
    for (index, line) in page.lines().enumerate() {
        let trimmed = line.trim();
        let Some(info) = &fence else {
            if let Some(info) = trimmed.strip_prefix("```")
                && (info == "sh" || info.starts_with("sh "))
            {
                fence = Some(info.to_owned());
                block_start = out.len();
            }
            continue;
        };
        if trimmed == "```" {
            anyhow::ensure!(!continued, "line {}: a block ends inside a continued command", index + 1);
            fence = None;
        } else if continued {
            let step = out.last_mut().expect("a continued command");
            continued = trimmed.ends_with('\\');
            step.command.push(' ');
            step.command.push_str(trimmed.trim_end_matches('\\').trim_end());
        } else if let Some(text) = trimmed.strip_prefix("# shows:") {
            anyhow::ensure!(out.len() > block_start, "line {}: `# shows:` before any command of its block", index + 1);
            let step = out.last_mut().expect("a command of this block");
            step.shows.push(text.trim().to_owned());
        } else if !trimmed.is_empty() && !trimmed.starts_with('#') {
            continued = trimmed.ends_with('\\');
            let command = trimmed.trim_end_matches('\\').trim_end().to_owned();
            out.push(Step { line: index + 1, fence: info.clone(), command, shows: Vec::new() });
        }
    }
    anyhow::ensure!(fence.is_none(), "a ```sh block is never closed");
    Ok(out)
}

/// A base port with P…P+13 free: the registry, the public-ID service and the workers of
/// `idgen up` (three per region, up to two regions).
pub fn up_base_port() -> u16 {
    loop {
        let base = 20_000 + (rand::random::<u16>() % 30_000);
        if (0..14).all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok()) {
            return base;
        }
    }
}

/// Starts `idgen up` in `dir` (its files under `dir/.idgen`) on a free base port, with `extra`
/// arguments, and waits up to a minute for "idgen is up"; its later output is drained.
pub async fn start_up(dir: &Path, extra: &[&str]) -> (Child, u16) {
    let port = up_base_port();
    (start_up_on(dir, port, extra).await, port)
}

/// [`start_up`] on the base port `port`.
pub async fn start_up_on(dir: &Path, port: u16, extra: &[&str]) -> Child {
    let mut child = Command::new(idgen_bin())
        .args(["up", "--base-port", &port.to_string(), "--dir", &dir.join(".idgen").to_string_lossy()])
        .args(extra)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("idgen is up") {
                return;
            }
        }
        panic!("idgen up exited before it was up");
    })
    .await
    .expect("idgen up within a minute");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_steps_reads_sh_blocks_only() {
        let page = "text\n\
            ```sh\n\
            # for the reader\n\
            idgen decode 1   # a trailing comment\n\
            # shows: machine 0\n\
            # shows: sequence 1\n\
            curl -s \\\n\
            \x20 localhost:8701/healthz\n\
            # shows: status\n\
            ```\n\
            ```text\n\
            systemctl restart idgen-worker\n\
            ```\n\
            \x20 ```sh tls\n\
            \x20 curl -s https://127.0.0.1:8701/healthz\n\
            \x20 # shows: ok\n\
            \x20 ```\n";
        let steps = shell_steps(page).unwrap();
        let step = |line: usize, fence: &str, command: &str, shows: &[&str]| Step {
            line,
            fence: fence.into(),
            command: command.into(),
            shows: shows.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            steps,
            [
                step(4, "sh", "idgen decode 1   # a trailing comment", &["machine 0", "sequence 1"]),
                step(7, "sh", "curl -s localhost:8701/healthz", &["status"]),
                step(15, "sh tls", "curl -s https://127.0.0.1:8701/healthz", &["ok"]),
            ]
        );
    }

    #[test]
    fn shell_steps_refuses_shows_without_a_command() {
        assert!(shell_steps("```sh\n# shows: x\n```\n").is_err());
        assert!(shell_steps("```sh\nidgen decode 1\n```\n```sh\n# shows: x\n```\n").is_err());
        assert!(shell_steps("```sh\nidgen decode 1 \\\n```\n").is_err());
        assert!(shell_steps("```sh\nidgen decode 1\n").is_err());
    }
}
