//! `idgen-registry --config registry.toml`: the region registry. (`idgen registry` is the same.)

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
#[command(about = "idgen region registry: never-reused region numbers and the layout schedule")]
struct Args {
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let config = idgen_registry::RegistryConfig::load(Args::parse().config.as_deref())?;
    idgen_registry::serve(config, idgen::shutdown_signal()).await
}
