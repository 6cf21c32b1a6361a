//! `idgen up`: the local platform in one command.
//!
//! Starts the region registry (port P, SQLite under `./.idgen/`), registers the regions, and for
//! each region a fleet of three workers (P+1…P+3 for the first region, P+11…P+13 for the second,
//! …), each region with its own SQLite lease tables, and the public-ID service (P+9); all are child processes of this binary
//! (`idgen registry`, `idgen worker`). It prints the endpoints and the operator token, and on
//! Ctrl-C (or SIGTERM) stops the workers — each finishes its in-flight requests and releases its
//! lease — and then the registry. The children run in their own process group and die with this
//! process, so nothing is left behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::table::Table;

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Moves every default port: the registry listens on P, the first region's workers on
    /// P+1…P+3, the second region's on P+11…P+13, and so on (default P = 8700).
    #[arg(long, default_value_t = 8700)]
    pub base_port: u16,
    /// Where the databases, configs, schedule copies and the operator token live.
    #[arg(long, default_value = ".idgen")]
    pub dir: PathBuf,
    /// The regions, comma-separated; the first is the home region (the one that issues v1).
    #[arg(long, default_value = "us-east-1", value_delimiter = ',')]
    pub regions: Vec<String>,
    /// Schedule the v2 cutover this far ahead (e.g. 60s, 5m), to watch the switch. Starts a fresh
    /// registry database, since a schedule's past can never change.
    #[arg(long, value_parser = parse_duration)]
    pub cutover_in: Option<Duration>,
    /// Workers per region (machine numbers 0–63 are shared among them).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub workers: u16,
    /// Require a kernel-synchronized clock, as production does. Off by default for development.
    #[arg(long)]
    pub require_clock_sync: bool,
    /// How long after a worker exits unexpectedly (killed, crashed) it is started again, as
    /// systemd restarts a production worker; doubled for each exit within a minute of its start.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub restart_after: Duration,
    /// Put every listener behind mutual TLS: makes a development CA, a server certificate for
    /// 127.0.0.1/localhost and client certificates (`orders`, `ingest`, and the platform's own
    /// `idgen-worker`; `operator.pem` from a separate operators' CA) under <dir>/tls/, with small
    /// example quotas.
    #[arg(long)]
    pub tls: bool,
    /// Print the endpoint summary as one JSON object (also written to <dir>/up.json, which
    /// `idgen status` reads) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// The development PKI of `up --tls` (and `idgen dev-certs`), written under `<dir>/tls/`.
pub struct DevTls {
    pub dir: PathBuf,
}

/// The encrypted public-ID format's development data key, under `--dir`.
const DEVELOPMENT_DATA_KEY: &str = "public-ids-data-key";

/// The identity of `operator.pem` (from the operators' CA), a certificate operator of the
/// registry. Not `operator`: that is the name the operator token writes under in the audit.
const CERTIFICATE_OPERATOR: &str = "local-operator";

/// Example quotas `up --tls` gives its two client identities (IDs per second, burst).
const EXAMPLE_QUOTAS: [(&str, u32, u32); 2] = [("orders", 1_000, 2_000), ("ingest", 50_000, 100_000)];

impl DevTls {
    /// Makes a new CA and its certificates in `<dir>/tls/`.
    pub fn create(dir: &Path) -> anyhow::Result<DevTls> {
        Self::create_in(&dir.join("tls"))
    }

    /// The same, in `dir` itself.
    pub fn create_in(dir: &Path) -> anyhow::Result<DevTls> {
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = idgen_server::pki::DevCa::new("idgen development CA")?;
        std::fs::write(dir.join("ca.pem"), ca.ca_pem())?;
        ca.server(&["127.0.0.1", "localhost"])?.write(&dir, "server")?;
        for identity in ["orders", "ingest", "idgen-worker"] {
            ca.client(identity)?.write(&dir, identity)?;
        }
        // Operators' certificates come from a CA of their own: the registry takes no certificate
        // of the callers' CA as an operator's, whatever it names.
        let operators = idgen_server::pki::DevCa::new("idgen development operator CA")?;
        std::fs::write(dir.join("operator-ca.pem"), operators.ca_pem())?;
        operators.client(CERTIFICATE_OPERATOR)?.write(&dir, "operator")?;
        Ok(DevTls { dir })
    }

    fn path(&self, file: &str) -> String {
        toml_string(&self.dir.join(file).to_string_lossy())
    }

    /// The `[tls]` section of every listener. The development certificates name their callers
    /// by CN (`orders`, …), so the listeners read the CN (`identity = "cn"`, development only).
    fn listener(&self) -> String {
        format!(
            "\n[tls]\ncert = {}\nkey = {}\nclient_ca = {}\nidentity = \"cn\"\n",
            self.path("server.pem"),
            self.path("server-key.pem"),
            self.path("ca.pem")
        )
    }

    /// The registry's `[tls]` section: every listener's, and the operators' CA.
    fn registry_listener(&self) -> String {
        format!("{}operator_ca = {}\n", self.listener(), self.path("operator-ca.pem"))
    }

    fn quotas(&self) -> String {
        let mut text = "\n[quotas.callers]\n".to_owned();
        for (caller, rate, burst) in EXAMPLE_QUOTAS {
            text += &format!("{caller} = {{ ids_per_second = {rate}, burst = {burst} }}\n");
        }
        text
    }

    /// A client for the platform's own calls (registering regions), as `operator`.
    fn operator_client(&self) -> anyhow::Result<reqwest::Client> {
        crate::tls::ClientTls {
            cacert: Some(self.dir.join("ca.pem")),
            cert: Some(self.dir.join("operator.pem")),
            key: Some(self.dir.join("operator-key.pem")),
        }
        .client()
    }

    /// `curl` with the CA and `identity`'s certificate.
    fn curl(&self, identity: &str) -> String {
        let file = |name: &str| self.dir.join(name).display().to_string();
        format!(
            "curl -s --cacert {} --cert {} --key {}",
            file("ca.pem"),
            file(&format!("{identity}.pem")),
            file(&format!("{identity}-key.pem"))
        )
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?}: expected a number and a unit, like 60s"))?;
    let ms = match unit {
        "ms" => number,
        "s" | "" => number * 1_000,
        "m" => number * 60_000,
        "h" => number * 3_600_000,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    Ok(Duration::from_millis(ms))
}

struct Running {
    name: String,
    url: String,
    child: Child,
    /// What started it, to start it again.
    args: Vec<String>,
    ready: &'static str,
    /// A worker is restarted when it exits; the registry or the public-ID service exiting stops
    /// everything.
    restartable: bool,
    started: tokio::time::Instant,
    /// Exited and waiting for its restart.
    down: bool,
}

/// The operator token: reused from `<dir>/operator-token`, or made and written there.
fn operator_token(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join("operator-token");
    if path.exists() {
        let token = idgen_server::pki::read_private(&path)?.trim().to_owned();
        if token.len() >= 16 {
            return Ok(token);
        }
    }
    let token: String = (0..32).map(|_| format!("{:x}", rand::random::<u8>() & 0xf)).collect();
    idgen_server::pki::write_private(&path, &format!("{token}\n"))?;
    Ok(token)
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    if args.regions.is_empty() || args.regions.len() > 8 {
        return Err(crate::Usage("--regions takes 1 to 8 region names".into()).into());
    }
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = args.dir.canonicalize().with_context(|| format!("resolving {}", args.dir.display()))?;
    let exe = std::env::current_exe().context("locating the idgen binary")?;
    if !args.require_clock_sync {
        eprintln!(
            "idgen up: clock synchronization check is OFF (development). Production workers refuse to issue without it."
        );
    }
    eprintln!(
        "idgen up: DEVELOPMENT mode: the registry and the public IDs live in SQLite files under {} and are set up at \
         start-up; the encrypted public-ID format uses a data key kept in {} (production: PostgreSQL, `idgen \
         registry init` / `idgen public init` once, and a KMS key).",
        dir.display(),
        dir.join(DEVELOPMENT_DATA_KEY).display()
    );
    let token = operator_token(&dir)?;
    let registry_db = dir.join("registry.db");
    if args.cutover_in.is_some() {
        // A new schedule with its past rewritten: the old registry goes, and so do the workers'
        // copies of it, which they would otherwise (rightly) refuse to see contradicted.
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", registry_db.display()));
        }
        // Their lease files go too: each table's genesis names the registry it was made for, and
        // the new one is another registry (nothing of the old platform runs: `up` owns it all).
        for region_dir in std::fs::read_dir(&dir)?.flatten().filter(|e| e.path().is_dir()) {
            for file in std::fs::read_dir(region_dir.path())?.flatten() {
                let name = file.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("schedule-worker-") || name.starts_with("leases.db") {
                    let _ = std::fs::remove_file(file.path());
                }
            }
        }
    }

    let tls = if args.tls { Some(DevTls::create(&dir).context("making the development certificates")?) } else { None };
    let mut running: Vec<Running> = Vec::new();
    let result = start_all(&args, &dir, &exe, &token, &registry_db, tls.as_ref(), &mut running).await;
    if let Err(error) = result {
        stop_all(&mut running).await;
        return Err(error);
    }

    let summary = summary(&args, &dir, &running, tls.as_ref());
    let state = dir.join("up.json");
    std::fs::write(&state, format!("{summary:#}\n")).with_context(|| format!("writing {}", state.display()))?;
    if args.json {
        println!("{summary}");
    } else {
        print_summary(&args, &dir, &running, &token, tls.as_ref());
    }

    let exited = supervise(&exe, &mut running, args.restart_after).await;
    if let Some((name, status)) = &exited {
        eprintln!("idgen up: {name} exited unexpectedly ({status}); stopping the others");
    }
    stop_all(&mut running).await;
    match exited {
        Some((name, _)) => bail!("{name} stopped unexpectedly"),
        None => {
            println!("idgen up: stopped; leases released");
            Ok(())
        }
    }
}

async fn start_all(
    args: &UpArgs,
    dir: &Path,
    exe: &Path,
    token: &str,
    registry_db: &Path,
    tls: Option<&DevTls>,
    running: &mut Vec<Running>,
) -> anyhow::Result<()> {
    let registry_config = dir.join("registry.toml");
    let mut registry_toml = format!(
        "# Written by `idgen up`; rewritten on every start.\ndevelopment = true\nlisten = {listen}\ndatabase_url = {db}\nhome_region = {home}\noperator_token_file = {token_file}\n\
         # A retirement takes effect a minute after it is asked for here (production: 24 h).\nretire_grace_ms = 60000\n",
        listen = toml_string(&format!("127.0.0.1:{}", args.base_port)),
        db = toml_string(&format!("sqlite://{}", registry_db.display())),
        home = toml_string(&args.regions[0]),
        token_file = toml_string(&dir.join("operator-token").to_string_lossy()),
    );
    if let Some(cutover) = args.cutover_in {
        let from = idgen::system_unix_ms() + cutover.as_millis() as i64 - idgen::core::EPOCH_UNIX_MS;
        registry_toml += &format!("initial_v2_from_ms = {from}\n");
    }
    if let Some(tls) = tls {
        registry_toml += &format!("certificate_operators = [\"{CERTIFICATE_OPERATOR}\"]\n");
        registry_toml += &tls.registry_listener();
    }
    std::fs::write(&registry_config, registry_toml)?;
    let registry = start_child(
        exe,
        "registry",
        &["registry", "--config", &registry_config.to_string_lossy()],
        "idgen-registry listening on ",
    )
    .await?;
    let registry_url = registry.url.clone();
    running.push(registry);

    let public_config = dir.join("public-ids.toml");
    std::fs::write(
        &public_config,
        format!(
            "# Written by `idgen up`; rewritten on every start. The encrypted format's data key is a\n# local file here (development only); production wraps it with KMS ([kms] key_id, region).\n# One type of public ID, `order` (the one the service's OpenAPI document's examples name).\ndevelopment = true\nlisten = {listen}\ndatabase_url = {db}\ndevelopment_key_file = {key}\ntypes = {{ order = {{ number = 1, format = \"opaque\" }} }}\n",
            listen =
                toml_string(&format!("127.0.0.1:{}", args.base_port.checked_add(9).context("--base-port too high")?)),
            db = toml_string(&format!("sqlite://{}", dir.join("public-ids.db").display())),
            key = toml_string(&dir.join(DEVELOPMENT_DATA_KEY).to_string_lossy()),
        ) + &tls.map(|tls| tls.listener() + &tls.quotas()).unwrap_or_default(),
    )?;
    running.push(
        start_child(
            exe,
            "public-ids",
            &["public", "serve", "--config", &public_config.to_string_lossy()],
            "idgen-public-ids listening on ",
        )
        .await?,
    );

    let http = match tls {
        Some(tls) => tls.operator_client()?,
        None => reqwest::Client::new(),
    };
    for region in &args.regions {
        let response = http
            .post(format!("{registry_url}/v1/regions"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "name": region }))
            .send()
            .await
            .context("registering the regions")?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        if !(status.is_success() || body["error"]["code"] == "name_exists") {
            bail!("registering region {region}: {status} {body}");
        }
    }

    for (r, region) in args.regions.iter().enumerate() {
        let region_dir = dir.join(region);
        std::fs::create_dir_all(&region_dir)?;
        for index in 1..=args.workers {
            let port = u16::try_from(u32::from(args.base_port) + 10 * r as u32 + u32::from(index))
                .context("--base-port too high for the worker ports")?;
            let name = format!("{region}/worker-{index}");
            let config_path = region_dir.join(format!("worker-{index}.toml"));
            let mut config = worker_config(args, &region_dir, region, &registry_url, index, port);
            if let Some(tls) = tls {
                config += &tls.listener();
                config += &tls.quotas();
                config += &format!(
                    "\n[registry_tls]\nca = {}\ncert = {}\nkey = {}\n",
                    tls.path("ca.pem"),
                    tls.path("idgen-worker.pem"),
                    tls.path("idgen-worker-key.pem")
                );
            }
            std::fs::write(&config_path, config).with_context(|| format!("writing {}", config_path.display()))?;
            if index == 1 {
                // The operator's step before a region's first worker: its lease tables made and
                // made the region's (`idgen leases init`), as the registry names them.
                let config = idgen_worker::config::WorkerConfig::load(Some(&config_path))?;
                let layouts = idgen::control::supervisor::registry_answer(&config, &registry_url).await?.0.layouts;
                let writer = crate::leases::RegistryWriter { http: http.clone(), token: Some(token.to_owned()) };
                for layout in layouts {
                    crate::leases::initialize(&config, &layout.name, "idgen-up", Some(&writer))
                        .await
                        .with_context(|| format!("making region {region}'s {} lease table", layout.name))?;
                }
            }
            let worker = start_child(
                exe,
                &name,
                &["worker", "--config", &config_path.to_string_lossy()],
                "idgen-worker listening on ",
            )
            .await?;
            running.push(Running { restartable: true, ..worker });
        }
    }
    Ok(())
}

fn toml_string(text: &str) -> String {
    // A JSON string literal is a valid TOML basic string.
    serde_json::to_string(text).expect("strings serialize")
}

fn worker_config(args: &UpArgs, region_dir: &Path, region: &str, registry_url: &str, index: u16, port: u16) -> String {
    format!(
        "# Written by `idgen up`; rewritten on every start.\n\
         development = true\n\
         listen = {listen}\n\
         region = {region}\n\
         registry_url = {registry}\n\
         schedule_cache = {cache}\n\
         registry_refresh_ms = 10000\n\
         shutdown_grace_ms = 5000\n\
         \n\
         [lease]\n\
         store = \"sqlite\"\n\
         sqlite_path = {path}\n\
         \n\
         [clock]\n\
         require_sync = {sync}\n",
        listen = toml_string(&format!("127.0.0.1:{port}")),
        region = toml_string(region),
        registry = toml_string(registry_url),
        cache = toml_string(&region_dir.join(format!("schedule-worker-{index}.json")).to_string_lossy()),
        path = toml_string(&region_dir.join("leases.db").to_string_lossy()),
        sync = args.require_clock_sync,
    )
}

/// The endpoints of the platform `up` started, as `--json` prints them and `<dir>/up.json` keeps
/// them: what `idgen status` reads.
fn summary(args: &UpArgs, dir: &Path, running: &[Running], tls: Option<&DevTls>) -> serde_json::Value {
    let workers: Vec<serde_json::Value> = running
        .iter()
        .filter_map(|p| {
            let (region, _) = p.name.split_once("/worker-")?;
            Some(serde_json::json!({ "name": p.name, "region": region, "url": p.url }))
        })
        .collect();
    serde_json::json!({
        "status": "up",
        "registry": running[0].url,
        "public_ids": running[1].url,
        "regions": args.regions,
        "workers": workers,
        "dir": dir.display().to_string(),
        "operator_token_file": dir.join("operator-token").display().to_string(),
        "tls_dir": tls.map(|tls| tls.dir.display().to_string()),
        "cutover_in_s": args.cutover_in.map(|c| c.as_secs()),
        "restart_after_s": args.restart_after.as_secs_f64(),
    })
}

fn print_summary(args: &UpArgs, dir: &Path, running: &[Running], token: &str, tls: Option<&DevTls>) {
    println!();
    println!(
        "idgen is up ({} region(s), {} workers each); data in {}",
        args.regions.len(),
        args.workers,
        dir.display()
    );
    let mut table = Table::new(&["PROCESS", "URL"]);
    for process in running {
        table.row([process.name.clone(), process.url.clone()]);
    }
    table.print();
    println!("operator token {} (in {})", token, dir.join("operator-token").display());
    if let Some(cutover) = args.cutover_in {
        println!(
            "v2 cutover in {} s: IDs before it are v1 (home region only), after it v2 with each region's number",
            cutover.as_secs()
        );
    }
    if let Some(tls) = tls {
        println!("mutual TLS: CA and certificates in {}", tls.dir.display());
        let mut quotas = Table::new(&["CALLER", "IDS/S", "BURST"]).right(&[1, 2]);
        for (caller, rate, burst) in EXAMPLE_QUOTAS {
            quotas.row([caller.to_owned(), rate.to_string(), burst.to_string()]);
        }
        quotas.print();
    }
    if let Some(worker) = running.get(2) {
        let curl = tls.map_or_else(|| "curl -s".to_owned(), |tls| tls.curl("orders"));
        println!();
        println!("  try:  {curl} -X POST {}/v1/ids", worker.url);
        println!("        {curl} -X POST {}/v1/ids:batch -d '{{\"count\": 5}}'", worker.url);
        println!("        {curl} {}/v1/ids/97301141913751557/decode", worker.url);
        println!("        {curl} {}/v1/layouts", running[0].url);
        println!(
            "        {curl} -X POST {}/v1/public-ids -d '{{\"internal_id\": \"97301141913751557\"}}'",
            running[1].url
        );
        println!("        idgen status");
        if tls.is_none() {
            println!("  console: {}/console (the regions, the schedule and any ID, in a browser)", running[0].url);
        }
    }
    println!();
    println!(
        "A worker that exits is started again after {} s, as systemd would; Ctrl-C stops everything and releases the leases.",
        args.restart_after.as_secs_f64()
    );
}

async fn start_child(exe: &Path, name: &str, args: &[&str], ready: &'static str) -> anyhow::Result<Running> {
    let mut command = Command::new(exe);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    #[cfg(unix)]
    {
        // Own process group: Ctrl-C reaches `up`, which stops the workers in order.
        command.process_group(0);
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to SIGTERM the child when
        // this process dies, so no worker outlives `up`.
        unsafe {
            command.pre_exec(|| {
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    let mut child = command.spawn().with_context(|| format!("starting {name}"))?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let stderr = child.stderr.take().context("worker stderr")?;
    forward(stderr, name.to_owned());
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(ready) {
                return Ok::<_, std::io::Error>(Some(rest.split_whitespace().next().unwrap_or("").to_owned()));
            }
            println!("[{name}] {line}");
        }
        Ok(None)
    })
    .await;
    let url = match url {
        Ok(Ok(Some(url))) => url,
        Ok(Ok(None)) | Ok(Err(_)) => bail!("{name} exited before it started listening (see its log above)"),
        Err(_) => bail!("{name} did not start listening within 30 s"),
    };
    let rest = name.to_owned();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            println!("[{rest}] {line}");
        }
    });
    Ok(Running {
        name: name.to_owned(),
        url,
        child,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ready,
        restartable: false,
        started: tokio::time::Instant::now(),
        down: false,
    })
}

fn forward(stream: impl AsyncRead + Unpin + Send + 'static, name: String) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[{name}] {line}");
        }
    });
}

/// Waits for Ctrl-C or SIGTERM (then `None`), restarting every worker that exits after
/// `restart_after` (doubled for each exit within a minute of its start, up to a minute); returns
/// the name and exit status of a process that is not restarted when it exits.
async fn supervise(exe: &Path, running: &mut [Running], restart_after: Duration) -> Option<(String, String)> {
    let stop = idgen_server::cli::shutdown_signal();
    tokio::pin!(stop);
    let mut quick_exits = vec![0u32; running.len()];
    let mut due: Vec<(usize, tokio::time::Instant)> = Vec::new();
    loop {
        let next = due.iter().map(|(_, at)| *at).min();
        let (index, status) = tokio::select! {
            _ = &mut stop => return None,
            exited = first_exit(running) => exited,
            _ = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {
                let now = tokio::time::Instant::now();
                let (ready, waiting): (Vec<_>, Vec<_>) = due.drain(..).partition(|(_, at)| *at <= now);
                due = waiting;
                for (index, _) in ready {
                    let process = &running[index];
                    let args: Vec<&str> = process.args.iter().map(String::as_str).collect();
                    match start_child(exe, &process.name, &args, process.ready).await {
                        Ok(started) => {
                            println!("idgen up: {} started again on {}", started.name, started.url);
                            running[index] = Running { restartable: true, ..started };
                        }
                        Err(error) => {
                            eprintln!("idgen up: could not start {} again ({error:#}); trying later", process.name);
                            due.push((index, now + restart_after.max(Duration::from_secs(1))));
                        }
                    }
                }
                continue;
            }
        };
        let process = &mut running[index];
        if !process.restartable {
            return Some((process.name.clone(), status));
        }
        process.down = true;
        quick_exits[index] =
            if process.started.elapsed() < Duration::from_secs(60) { quick_exits[index] + 1 } else { 1 };
        let delay =
            (restart_after * 2u32.pow(quick_exits[index].saturating_sub(1).min(5))).min(Duration::from_secs(60));
        eprintln!("idgen up: {} exited ({status}); starting it again in {:.1} s", process.name, delay.as_secs_f64());
        due.push((index, tokio::time::Instant::now() + delay));
    }
}

/// The index and exit status of the first running child to exit.
async fn first_exit(running: &mut [Running]) -> (usize, String) {
    let waits = running.iter_mut().enumerate().filter(|(_, process)| !process.down).map(|(index, process)| {
        Box::pin(async move {
            let status = process.child.wait().await;
            (index, status.map_or_else(|e| e.to_string(), |s| s.to_string()))
        })
    });
    futures_select_all(waits.collect()).await
}

/// The first of several futures to finish (a tiny `select_all`, to avoid a dependency for it);
/// never, for none.
async fn futures_select_all<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> F::Output {
    std::future::poll_fn(|cx| {
        for future in futures.iter_mut() {
            if let std::task::Poll::Ready(output) = std::pin::Pin::new(future).poll(cx) {
                return std::task::Poll::Ready(output);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// SIGTERM to each worker, then wait: each finishes its requests and releases its lease.
async fn stop_all(running: &mut [Running]) {
    // SIGTERM to every child at once: each worker finishes its requests and releases its lease.
    for worker in running.iter().filter(|worker| !worker.down) {
        if let Some(pid) = worker.child.id() {
            // SAFETY: kill only sends a signal to our own child process.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    for worker in running.iter_mut().filter(|worker| !worker.down) {
        match tokio::time::timeout(Duration::from_secs(15), worker.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => eprintln!("idgen up: {} exited with {status}", worker.name),
            Ok(Err(error)) => eprintln!("idgen up: waiting for {}: {error}", worker.name),
            Err(_) => {
                eprintln!("idgen up: {} did not stop in 15 s; killing it", worker.name);
                let _ = worker.child.kill().await;
            }
        }
    }
}
