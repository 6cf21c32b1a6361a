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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let args = Args::parse();
    let config = WorkerConfig::load(args.config.as_deref())?;
    main_with(config, args.config).await
}
