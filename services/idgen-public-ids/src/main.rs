//! `idgen-public-ids --config public-ids.toml`. (`idgen public serve` is the same; `idgen public
//! init` initializes its database.)

use clap::Parser;
use idgen_public_ids::PublicIdsConfig;
use idgen_server::cli::{ServiceArgs, exit, init_tracing, shutdown_signal};

#[derive(Parser)]
#[command(about = "idgen public-ID service: opaque, UUIDv7 and KMS-encrypted public IDs")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_tracing();
    let Args { service } = Args::parse();
    let result = async {
        match service.config::<PublicIdsConfig>()? {
            Some(config) => idgen_public_ids::serve(config, service.config, shutdown_signal()).await,
            None => Ok(()),
        }
    };
    exit("idgen-public-ids", result.await)
}
