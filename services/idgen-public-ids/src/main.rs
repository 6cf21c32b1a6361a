//! `idgen-public-ids --config public-ids.toml`. (`idgen public serve` is the same; `idgen public
//! init` initializes its database.)

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "idgen public-ID service: opaque, UUIDv7 and KMS-encrypted public IDs")]
struct Args {
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    idgen::init_tracing();
    let file = Args::parse().config;
    let result = async {
        let config = idgen_public_ids::PublicIdsConfig::load(file.as_deref())?;
        idgen_public_ids::serve(config, file, idgen::shutdown_signal()).await
    };
    idgen::config::exit("idgen-public-ids", result.await)
}
