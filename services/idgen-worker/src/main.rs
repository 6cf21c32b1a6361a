//! `idgen-worker --config worker.toml`: one regional fleet worker. (`idgen worker` is the same.)

use std::path::PathBuf;

use clap::Parser;
use idgen_worker::{WorkerConfig, init_tracing, main_with};

#[derive(Parser)]
#[command(about = "idgen fleet worker: hands out unique 64-bit IDs over HTTP")]
struct Args {
    /// TOML configuration file; environment variables IDGEN_WORKER_… override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Validate the configuration and load its TLS files, print what it would run with, and exit.
    #[arg(long)]
    check_config: bool,
    /// Print every key of the configuration file, with its default, unit and what it does, as
    /// commented TOML, and exit.
    #[arg(long, conflicts_with = "config")]
    print_config: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_tracing();
    let args = Args::parse();
    if args.print_config {
        print!("{}", WorkerConfig::print());
        return std::process::ExitCode::SUCCESS;
    }
    let result = async {
        let config = WorkerConfig::load(args.config.as_deref())?;
        if args.check_config {
            println!("worker configuration OK");
            for line in config.check()? {
                println!("  {line}");
            }
            return Ok(());
        }
        main_with(config, args.config).await
    };
    idgen::config::exit("idgen-worker", result.await)
}
