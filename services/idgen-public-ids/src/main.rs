//! `idgen-public-ids --config public-ids.toml`. (`idgen public serve` is the same.)

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
#[command(about = "idgen public-ID service: opaque, UUIDv7 and KMS-encrypted public IDs")]
struct Args {
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let config = idgen_public_ids::PublicIdsConfig::load(Args::parse().config.as_deref())?;
    idgen_public_ids::serve(config, idgen::shutdown_signal()).await
}
