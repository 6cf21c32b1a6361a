//! `idgen`: the one operator binary. `up` starts the local platform; `worker` runs one fleet
//! worker; `decode` takes IDs apart. Human-readable output by default, JSON with `--json`.

mod control;
mod duplicates;
mod ids;
mod leases;
mod public;
mod status;
mod table;
mod tls;
mod up;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idgen_server::ServiceArgs;
use idgen_worker::config::WorkerConfig;

#[derive(Parser)]
#[command(
    name = "idgen",
    version,
    about = "Unique 64-bit IDs: the local platform, workers and operator tools",
    after_help = "Exit status, the same for every command:\n  \
                  0  done\n  \
                  1  refused, failed or not found (a server said no, a backend did not answer, \
                  status found something down)\n  \
                  2  usage: bad arguments, or input that is not what it should be (e.g. not an ID); \
                  a service refusing to start for its configuration or database\n  \
                  3  only `idgen duplicates`: duplicates were found (so a job can tell found from failed)\n\n\
                  Every command that prints data takes --json (one JSON value per line)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the local platform: the registry and three workers per region, on SQLite under ./.idgen/.
    Up(up::UpArgs),
    /// Run one fleet worker (the same as the `idgen-worker` binary).
    Worker {
        #[command(flatten)]
        service: ServiceArgs,
        /// Create missing lease tables first (development; production runs `idgen leases init`).
        #[arg(long)]
        create_tables: bool,
    },
    /// Run the region registry (the same as the `idgen-registry` binary); `idgen registry init`
    /// initializes its database, once, before the first start.
    #[command(args_conflicts_with_subcommands = true)]
    Registry {
        #[command(flatten)]
        service: ServiceArgs,
        #[command(subcommand)]
        command: Option<RegistryCommand>,
    },
    /// Mint IDs through the client library: the local fleet (--url), failing over to --backup
    /// fleets and back; --watch keeps minting.
    Ids(ids::IdsArgs),
    /// Find IDs that occur more than once, in a file (one per line, or --csv --column N) or a
    /// PostgreSQL column, decode each and, with --leases, show who held its machine number then.
    /// Exits 0 when there is none, 3 when there are (1 on an error).
    Duplicates(duplicates::DuplicatesArgs),
    /// One screen of the platform: the registry, the schedule and horizon, every region, each
    /// worker's health (the reason when refusing) and its leases. The local platform is the one
    /// `idgen up` started (<dir>/up.json); name another with --registry and --worker REGION=URL.
    /// Exits 1 when anything is down or refusing.
    Status(status::StatusArgs),
    /// Shell completions: `idgen completions bash > /etc/bash_completion.d/idgen` (or zsh, fish).
    Completions { shell: clap_complete::Shell },
    /// Inspect and operate the lease table: init, list, get, history, quarantine, release-quarantine.
    Leases(leases::LeasesArgs),
    /// Decode IDs (63-bit or UUIDv7): with the registry's schedule and region names when
    /// `--registry` is given, else with the default schedule.
    Decode {
        #[arg(required = true)]
        ids: Vec<String>,
        #[arg(long)]
        json: bool,
        /// The registry's base URL, e.g. http://127.0.0.1:8700.
        #[arg(long, env = "IDGEN_REGISTRY_URL", value_parser = crate::registry_url)]
        registry: Option<String>,
        #[command(flatten)]
        tls: tls::ClientTls,
    },
    /// Public IDs: serve, create, resolve, rotate-key.
    Public {
        #[command(flatten)]
        tls: tls::ClientTls,
        #[command(subcommand)]
        command: public::PublicCommand,
    },
    /// Make a development CA and certificates (what `up --tls` uses): ca.pem, server.pem for
    /// 127.0.0.1/localhost, and client certificates orders, ingest and idgen-worker (named by
    /// CN), each with its -key.pem; and operator-ca.pem, the operators' own CA, with
    /// operator.pem (`local-operator`). Never for production: use a real CA (e.g. AWS Private CA).
    DevCerts {
        #[arg(long, default_value = ".idgen/tls")]
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// The registry's regions: list, add, retire, cancel-retire.
    Regions {
        #[command(flatten)]
        registry: control::Registry,
        #[command(subcommand)]
        command: control::RegionsCommand,
    },
    /// The registry's layout schedule: show, schedule.
    Layouts {
        #[command(flatten)]
        registry: control::Registry,
        #[command(subcommand)]
        command: control::LayoutsCommand,
    },
}

#[derive(Subcommand)]
enum RegistryCommand {
    /// Make the configured database a registry's: apply the migrations and publish the home
    /// region and the first layouts (v1, and v2 from 2028-01-01 or initial_v2_from_ms). Run once
    /// for a new registry, and again after an upgrade (it applies new migrations). Idempotent:
    /// on a registry's database it changes nothing else; it refuses another service's database
    /// and one that names another home region. A production registry never does this itself.
    Init {
        /// The registry's configuration (its database_url and home_region are what init uses).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        owner: OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// Make a new operator token: prints the token once, for the operator to keep (the CLI
    /// reads it from --token-file), and the line for the registry's [operators], which holds only
    /// the token's SHA-256. Nothing is written anywhere; run it again to replace a lost token.
    Token {
        /// The operator's name, as the audit will show it (letters, digits, `.`, `_`, `-`).
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
}

/// `--owner-url`: the migrations run as another role than the service's.
#[derive(clap::Args, Debug)]
pub struct OwnerUrl {
    /// PostgreSQL: the same database as database_url, as the role that owns its schema. The
    /// migrations (and data keys) are written as that role, and database_url's role, the one
    /// the service runs as, is granted exactly what the service uses (no DDL, no DELETE).
    /// Without it one role does both. A URL may carry a password: prefer the environment.
    #[arg(long = "owner-url", env = "IDGEN_OWNER_DATABASE_URL", hide_env_values = true)]
    pub url: Option<String>,
    /// With --owner-url: the password of database_url's role, which init makes (LOGIN, nothing
    /// else) if missing and sets; from the environment only, never the command line.
    #[arg(skip = std::env::var("IDGEN_RUNTIME_DATABASE_PASSWORD").ok())]
    pub runtime_password: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => runtime().and_then(|rt| rt.block_on(up::run(args))),
        Command::Registry { command: Some(RegistryCommand::Init { config, owner, json }), .. } => {
            runtime().and_then(|rt| rt.block_on(registry_init(config, &owner, json)))
        }
        Command::Registry { command: Some(RegistryCommand::Token { name, json }), .. } => operator_token(&name, json),
        Command::Worker { service, create_tables } => serve(service, |mut config: WorkerConfig, file| {
            config.lease.create_tables |= create_tables;
            idgen_worker::main_with(config, file)
        }),
        Command::Registry { service, command: None } => {
            serve(service, |config, file| idgen_registry::serve(config, file, idgen_server::cli::shutdown_signal()))
        }
        Command::Ids(args) => {
            idgen_server::cli::init_tracing();
            runtime().and_then(|rt| rt.block_on(ids::run(args)))
        }
        Command::Status(args) => match runtime().and_then(|rt| rt.block_on(status::run(args))) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(error) => Err(error),
        },
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "idgen",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Leases(args) => runtime().and_then(|rt| rt.block_on(leases::run(args))),
        Command::Duplicates(args) => match runtime().and_then(|rt| rt.block_on(duplicates::run(args))) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(3),
            Err(error) => Err(error),
        },
        Command::Decode { ids, json, registry, tls } => return decode(&ids, json, registry.as_deref(), &tls),
        Command::Public { tls, command } => {
            idgen_server::cli::init_tracing();
            runtime().and_then(|rt| rt.block_on(public::run(command, &tls)))
        }
        Command::DevCerts { dir, json } => up::DevTls::create_in(&dir).map(|tls| match json {
            true => println!("{}", serde_json::json!({"dir": tls.dir.display().to_string()})),
            false => println!("development CA and certificates written to {}", tls.dir.display()),
        }),
        Command::Regions { registry, command } => runtime().and_then(|rt| rt.block_on(registry.regions(command))),
        Command::Layouts { registry, command } => runtime().and_then(|rt| rt.block_on(registry.layouts(command))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idgen: {error:#}");
            if error.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(idgen_server::cli::exit_status(&error))
            }
        }
    }
}

/// `idgen registry init`.
async fn registry_init(file: Option<PathBuf>, owner: &OwnerUrl, json: bool) -> anyhow::Result<()> {
    use idgen_registry::store::Initialized;
    let config = idgen_registry::RegistryConfig::load(file.as_deref())?;
    let database = idgen::config::redacted_url(config.database_url());
    let done = idgen_registry::init(&config, owner.url.as_deref(), owner.runtime_password.as_deref()).await?;
    let (initialized, line) = match &done {
        Initialized::Now => (
            true,
            format!(
                "registry initialized in {database}: home region {}, layouts v1 and v2 published",
                config.home_region()
            ),
        ),
        Initialized::Already { home_region, regions } => (
            false,
            format!(
                "{database} is already a registry's (home region {home_region}, {regions} region(s)); migrations are \
                 up to date, nothing else changed"
            ),
        ),
    };
    match json {
        true => println!(
            "{}",
            serde_json::json!({"initialized": initialized, "database": database, "home_region": config.home_region()})
        ),
        false => println!("{line}"),
    }
    Ok(())
}

/// A mistake in how a command was called that clap cannot see (a malformed value, arguments
/// that contradict each other): exit status 2, like clap's own usage errors.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A `--registry` URL (`IDGEN_REGISTRY_URL`): https, or plain http on loopback (a development
/// registry); operator tokens and the schedule never cross a network in clear. A usage error.
pub fn registry_url(text: &str) -> Result<String, String> {
    idgen::control::registry::check_registry_url(text, true).map(|()| text.to_owned())
}

/// A service, run as its binary runs it: `--print-config` and `--check-config` answered, or
/// the service served until a signal stops it.
fn serve<C, F>(service: ServiceArgs, run: impl FnOnce(C, Option<PathBuf>) -> F) -> anyhow::Result<()>
where
    C: idgen_server::ServiceConfig,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    idgen_server::cli::init_tracing();
    runtime()?.block_on(service.serve(run))
}

/// `idgen registry token`: a new token and its hash for the configuration.
fn operator_token(name: &str, json: bool) -> anyhow::Result<()> {
    // The name becomes a TOML key as written; a bare key keeps that line copyable as printed.
    let bare = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !bare || name.contains('.') && name.split('.').any(str::is_empty) || name.len() > 64 {
        return Err(
            Usage(format!("--name {name:?}: an operator's name is 1 to 64 letters, digits, `.`, `_` or `-`")).into()
        );
    }
    let token = idgen_registry::operators::new_token()?;
    let hash = idgen_registry::operators::TokenHash::of(&token);
    // A dotted name is a nested key in TOML: quote it.
    let key = if name.contains('.') { format!("\"{name}\"") } else { name.to_owned() };
    if json {
        println!(
            "{}",
            serde_json::json!({"name": name, "token": token, "hash": hash.to_string(), "config": format!("{key} = \"{hash}\"")})
        );
        return Ok(());
    }
    println!("token for {name} (shown once; give it to {name}, who keeps it in a file only they can read):");
    println!("  {token}");
    println!("the line for the registry's [operators] (it holds only the token's SHA-256), then SIGHUP or restart it:");
    println!("  {key} = \"{hash}\"");
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn decode(ids: &[String], json: bool, registry: Option<&str>, tls: &tls::ClientTls) -> ExitCode {
    let (schedule, names) = match registry {
        None => (WorkerConfig::default().schedule(), HashMap::new()),
        Some(url) => {
            let fetched = tls.client().and_then(|http| {
                runtime().and_then(|rt| {
                    rt.block_on(idgen::RegistrySnapshot::fetch_with(&http, url)).map_err(anyhow::Error::from)
                })
            });
            match fetched.and_then(|s| Ok((s.schedule()?, s.region_names()))) {
                Ok(found) => found,
                Err(error) => {
                    eprintln!("idgen: {error:#}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let mut failed = false;
    for text in ids {
        match idgen_worker::api::decode_to_json(text, &schedule, &names) {
            Ok(decoded) if json => println!("{decoded}"),
            Ok(decoded) => println!("{}", human(&decoded)),
            Err(error) => {
                failed = true;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"id": text, "error": {"code": error.code(), "message": error.message()}})
                    );
                } else {
                    eprintln!("{text}: {}", error.message());
                }
            }
        }
    }
    if failed { ExitCode::from(2) } else { ExitCode::SUCCESS }
}

fn human(decoded: &serde_json::Value) -> String {
    let mut line = format!(
        "{}  layout {}  created {}",
        decoded["id"].as_str().unwrap_or(""),
        decoded["layout"].as_str().unwrap_or(""),
        decoded["created_at"].as_str().unwrap_or("")
    );
    if let Some(region) = decoded.get("region_number") {
        line += &format!("  region {region}");
        if let Some(name) = decoded.get("region").and_then(|n| n.as_str()) {
            line += &format!(" ({name})");
        }
    }
    for field in ["machine", "sequence"] {
        if let Some(value) = decoded.get(field) {
            line += &format!("  {field} {value}");
        }
    }
    line
}
