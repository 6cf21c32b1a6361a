//! `idgen-worker --config worker.toml`: one regional fleet worker. (`idgen worker` is the same.)

use clap::Parser;
use idgen_server::cli::{ServiceArgs, exit, init_tracing};
use idgen_worker::{WorkerConfig, main_with};

#[derive(Parser)]
#[command(about = "idgen fleet worker: hands out unique 64-bit IDs over HTTP")]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_tracing();
    let Args { service } = Args::parse();
    let result = async {
        match service.config::<WorkerConfig>()? {
            Some(config) => main_with(config, service.config).await,
            None => Ok(()),
        }
    };
    exit("idgen-worker", result.await)
}
