//! `idgen-worker --config worker.toml`: one regional fleet worker. (`idgen worker` is the same.)

use clap::Parser;
use idgen_server::ServiceArgs;

#[derive(Parser)]
#[command(about = "idgen fleet worker: hands out unique 64-bit IDs over HTTP")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idgen_server::cli::run("idgen-worker", Args::parse().service, idgen_worker::main_with).await
}
