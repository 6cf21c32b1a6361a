//! `idgen-public-ids --config public-ids.toml`. (`idgen public serve` is the same; `idgen public
//! init` initializes its database.)

use clap::Parser;
use idgen_server::ServiceArgs;
use idgen_server::cli::shutdown_signal;

#[derive(Parser)]
#[command(about = "idgen public-ID service: opaque, UUIDv7 and KMS-encrypted public IDs")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let serve = |config, file| idgen_public_ids::serve(config, file, shutdown_signal());
    idgen_server::cli::run("idgen-public-ids", Args::parse().service, serve).await
}
