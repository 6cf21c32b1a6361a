//! `idgen up`: the local platform in one command.
//!
//! Starts three fleet workers of one region as child processes of this binary (`idgen worker`),
//! each on its own port and all sharing one SQLite lease table under `./.idgen/`, prints the
//! endpoints, and on Ctrl-C (or SIGTERM) stops them; each worker finishes its in-flight requests
//! and releases its lease before it exits. The workers run in their own process group and die
//! with this process, so nothing is left behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Moves every default port: workers listen on P+1, P+2, P+3 (default 8701–8703).
    #[arg(long, default_value_t = 8700)]
    pub base_port: u16,
    /// Where the lease table, worker configs and the operator token live.
    #[arg(long, default_value = ".idgen")]
    pub dir: PathBuf,
    /// The region these workers serve.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// How many workers (machine numbers 0–63 are shared among them).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub workers: u16,
    /// Require a kernel-synchronized clock, as production does. Off by default for development.
    #[arg(long)]
    pub require_clock_sync: bool,
}

struct Running {
    name: String,
    url: String,
    child: Child,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = args.dir.canonicalize().with_context(|| format!("resolving {}", args.dir.display()))?;
    let exe = std::env::current_exe().context("locating the idgen binary")?;
    if !args.require_clock_sync {
        eprintln!(
            "idgen up: clock synchronization check is OFF (development). Production workers refuse to issue without it."
        );
    }

    let mut running: Vec<Running> = Vec::new();
    for index in 1..=args.workers {
        let port = args.base_port.checked_add(index).context("--base-port too high for the worker ports")?;
        let name = format!("worker-{index}");
        let config_path = dir.join(format!("{name}.toml"));
        std::fs::write(&config_path, worker_config(&args, &dir, port))
            .with_context(|| format!("writing {}", config_path.display()))?;
        match start_worker(&exe, &name, &config_path).await {
            Ok(worker) => running.push(worker),
            Err(error) => {
                stop_all(&mut running).await;
                return Err(error);
            }
        }
    }

    println!();
    println!(
        "idgen is up: region {} with {} workers, leases in {}",
        args.region,
        running.len(),
        dir.join("leases.db").display()
    );
    for worker in &running {
        println!("  {:<9} {}", worker.name, worker.url);
    }
    if let Some(first) = running.first() {
        println!();
        println!("  try:  curl -s -X POST {}/v1/ids", first.url);
        println!("        curl -s -X POST {}/v1/ids:batch -d '{{\"count\": 5}}'", first.url);
        println!("        curl -s {}/v1/ids/97301141913751557/decode", first.url);
        println!("        curl -s {}/healthz", first.url);
    }
    println!();
    println!("Ctrl-C stops the workers and releases their leases.");

    let exited = tokio::select! {
        _ = idgen_worker::shutdown_signal() => None,
        exited = first_exit(&mut running) => Some(exited),
    };
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

fn toml_string(text: &str) -> String {
    // A JSON string literal is a valid TOML basic string.
    serde_json::to_string(text).expect("strings serialize")
}

fn worker_config(args: &UpArgs, dir: &Path, port: u16) -> String {
    format!(
        "# Written by `idgen up`; rewritten on every start.\n\
         listen = {listen}\n\
         region = {region}\n\
         region_number = 0\n\
         home_region = true\n\
         shutdown_grace_ms = 5000\n\
         \n\
         [lease]\n\
         store = \"sqlite\"\n\
         sqlite_path = {path}\n\
         \n\
         [clock]\n\
         require_sync = {sync}\n",
        listen = toml_string(&format!("127.0.0.1:{port}")),
        region = toml_string(&args.region),
        path = toml_string(&dir.join("leases.db").to_string_lossy()),
        sync = args.require_clock_sync,
    )
}

async fn start_worker(exe: &Path, name: &str, config: &Path) -> anyhow::Result<Running> {
    let mut command = Command::new(exe);
    command
        .arg("worker")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
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
            if let Some(rest) = line.strip_prefix("idgen-worker listening on ") {
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
    Ok(Running { name: name.to_owned(), url, child })
}

fn forward(stream: impl AsyncRead + Unpin + Send + 'static, name: String) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[{name}] {line}");
        }
    });
}

async fn first_exit(running: &mut [Running]) -> (String, String) {
    let waits = running.iter_mut().map(|worker| {
        Box::pin(async move {
            let status = worker.child.wait().await;
            (worker.name.clone(), status.map_or_else(|e| e.to_string(), |s| s.to_string()))
        })
    });
    futures_select_all(waits.collect()).await
}

/// The first of several futures to finish (a tiny `select_all`, to avoid a dependency for it).
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
    for worker in running.iter() {
        if let Some(pid) = worker.child.id() {
            // SAFETY: kill only sends a signal to our own child process.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    for worker in running.iter_mut() {
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
