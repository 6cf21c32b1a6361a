//! `idgen-registry --config registry.toml`: the region registry. (`idgen registry` is the same;
//! `idgen registry init` initializes its database.)

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "idgen region registry: never-reused region numbers and the layout schedule")]
struct Args {
    #[arg(long)]
    config: Option<PathBuf>,
    /// Validate the configuration and load its TLS and token files, print what it would run
    /// with, and exit.
    #[arg(long)]
    check_config: bool,
    /// Print every key of the configuration file, with its default, unit and what it does, as
    /// commented TOML, and exit.
    #[arg(long, conflicts_with = "config")]
    print_config: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    idgen::init_tracing();
    let Args { config: file, check_config, print_config } = Args::parse();
    if print_config {
        print!("{}", idgen_registry::RegistryConfig::print());
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = idgen_registry::RegistryConfig::load(file.as_deref())?;
        if check_config {
            println!("registry configuration OK");
            for line in config.check()? {
                println!("  {line}");
            }
            return Ok(());
        }
        idgen_registry::serve(config, file, idgen::shutdown_signal()).await
    };
    idgen::config::exit("idgen-registry", result.await)
}
