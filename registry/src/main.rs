//! `idgen-registry --config registry.toml`: the region registry. (`idgen registry` is the same;
//! `idgen registry init` initializes its database.)

use clap::Parser;
use idgen_registry::RegistryConfig;
use idgen_server::cli::{ServiceArgs, exit, init_tracing, shutdown_signal};

#[derive(Parser)]
#[command(about = "idgen region registry: never-reused region numbers and the layout schedule")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_tracing();
    let Args { service } = Args::parse();
    let result = async {
        match service.config::<RegistryConfig>()? {
            Some(config) => idgen_registry::serve(config, service.config, shutdown_signal()).await,
            None => Ok(()),
        }
    };
    exit("idgen-registry", result.await)
}
