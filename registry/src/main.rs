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
    idgen::init_tracing();
    let file = Args::parse().config;
    let config = idgen_registry::RegistryConfig::load(file.as_deref())?;
    idgen_registry::serve(config, file, idgen::shutdown_signal()).await
}
