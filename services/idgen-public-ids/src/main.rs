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
    /// Print every key of the configuration file, with its default, unit and what it does, as
    /// commented TOML, and exit.
    #[arg(long, conflicts_with = "config")]
    print_config: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    idgen::init_tracing();
    let Args { config: file, print_config } = Args::parse();
    if print_config {
        print!("{}", idgen_public_ids::PublicIdsConfig::print());
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = idgen_public_ids::PublicIdsConfig::load(file.as_deref())?;
        idgen_public_ids::serve(config, file, idgen::shutdown_signal()).await
    };
    idgen::config::exit("idgen-public-ids", result.await)
}
