//! What a service process does around its service: its command line (one argument struct,
//! [`ServiceArgs`], that `idgen-worker`, `idgen-registry`, `idgen-public-ids` and the `idgen`
//! subcommands running them all flatten), its log, the signals it stops on, and how it ends
//! (one exit-status scheme). The embeddable generator carries none of this: an application that
//! embeds it keeps its own.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `--config`, `--check-config` and `--print-config`, the same for every service.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServiceArgs {
    /// TOML configuration file; environment variables (IDGEN_WORKER_…, IDGEN_REGISTRY_…,
    /// IDGEN_PUBLIC_IDS_…) override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Validate the configuration and load the files it names (TLS, tokens, keys), print what
    /// the service would run with, and exit (0 when it would start).
    #[arg(long)]
    pub check_config: bool,
    /// Print every key of the configuration file, with its default, unit and what it does, as
    /// commented TOML, and exit.
    #[arg(long, conflicts_with = "config")]
    pub print_config: bool,
}

/// What a service's configuration gives its command line.
pub trait ServiceConfig: Sized {
    /// The service as `--check-config` names it ("worker", "registry", "public-ID service").
    const SERVICE: &'static str;

    /// Every key, as commented TOML (`--print-config`).
    fn print() -> String;

    /// The file (or the defaults) with the environment over it, validated.
    fn load(file: Option<&Path>) -> anyhow::Result<Self>;

    /// The files it names loaded, and one line per thing it would run with (`--check-config`).
    fn check(&self) -> anyhow::Result<Vec<String>>;
}

impl ServiceArgs {
    /// Does what `--print-config` or `--check-config` asks and answers `None`; otherwise the
    /// configuration to serve.
    pub fn config<C: ServiceConfig>(&self) -> anyhow::Result<Option<C>> {
        if self.print_config {
            print!("{}", C::print());
            return Ok(None);
        }
        let config = C::load(self.config.as_deref())?;
        if !self.check_config {
            return Ok(Some(config));
        }
        let lines = config.check()?;
        let source = self.config.as_ref().map_or("defaults and environment".to_owned(), |f| f.display().to_string());
        println!("{} configuration OK: {source}", C::SERVICE);
        for line in lines {
            println!("  {line}");
        }
        Ok(None)
    }

    /// Does what `--print-config` or `--check-config` asks; otherwise runs `serve` with the
    /// configuration and the file it came from.
    pub async fn serve<C, F>(self, serve: impl FnOnce(C, Option<PathBuf>) -> F) -> anyhow::Result<()>
    where
        C: ServiceConfig,
        F: std::future::Future<Output = anyhow::Result<()>>,
    {
        match self.config::<C>()? {
            Some(config) => serve(config, self.config).await,
            None => Ok(()),
        }
    }
}

/// A service binary's `main`: the log set up, the flags done (`--print-config`,
/// `--check-config`), or `serve` run with the configuration until it returns; then the exit
/// status of [`exit`] for `program`.
pub async fn run<C, F>(program: &str, args: ServiceArgs, serve: impl FnOnce(C, Option<PathBuf>) -> F) -> ExitCode
where
    C: ServiceConfig,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    init_tracing();
    exit(program, args.serve(serve).await)
}

/// The exit status for an error a process ends with: 2 for a start refused for its
/// configuration or database ([`idgen::config::Refused`]: systemd does not restart on it), else
/// 1.
pub fn exit_status(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<idgen::config::Refused>()) { 2 } else { 1 }
}

/// How a service process ends: 0, or the error on stderr after `program` and [`exit_status`].
pub fn exit(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error:#}");
            ExitCode::from(exit_status(&error))
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), coloured only on a terminal.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}

/// SIGINT (Ctrl-C) or SIGTERM: what every idgen service stops on.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_start_exits_2_and_anything_else_1() {
        let refused = anyhow::Error::new(idgen::config::Refused("no [tls]".into())).context("starting");
        assert_eq!(exit_status(&refused), 2);
        assert_eq!(exit_status(&anyhow::anyhow!("the port is taken")), 1);
    }
}
