//! `idgen-registry --config registry.toml`: the region registry. (`idgen registry` is the same;
//! `idgen registry init` initializes its database.)

use clap::Parser;
use idgen_server::ServiceArgs;
use idgen_server::cli::shutdown_signal;

#[derive(Parser)]
#[command(about = "idgen region registry: never-reused region numbers and the layout schedule")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let serve = |config, file| idgen_registry::serve(config, file, shutdown_signal());
    idgen_server::cli::run("idgen-registry", Args::parse().service, serve).await
}
