//! `idgen ids`: mints IDs through the client library, as a service would — the local fleet
//! first, the backups when it fails, back once it answers its health probe. For scripts, and to
//! watch a failover happen (`--watch`).

use std::time::Duration;

use clap::Args;
use idgen_client::{Client, ClientConfig};

#[derive(Args, Debug, Clone)]
pub struct IdsArgs {
    /// How many IDs (or UUIDs), per round with --watch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    count: u32,
    /// UUIDv7s instead of 64-bit IDs.
    #[arg(long)]
    uuid: bool,
    /// The local region's fleet.
    #[arg(long, env = "IDGEN_URL", default_value = "http://127.0.0.1:8701")]
    url: String,
    /// A backup region's fleet, tried in the order given when the local one fails; repeatable.
    #[arg(long = "backup")]
    backups: Vec<String>,
    /// The registry, to decode each ID (layout, region, machine) in --json output.
    #[arg(long, env = "IDGEN_REGISTRY_URL", value_parser = crate::registry_url)]
    registry: Option<String>,
    /// One JSON object per line: the ID, the endpoint that issued it, and with --registry its fields.
    #[arg(long)]
    json: bool,
    /// Keep minting, a round every --interval, until Ctrl-C; a round no endpoint answers is
    /// reported on stderr and the next one tried.
    #[arg(long)]
    watch: bool,
    #[arg(long, default_value = "1s", value_parser = crate::up::parse_duration)]
    interval: Duration,
    /// How long the client waits for one request before trying the next endpoint.
    #[arg(long, default_value = "1s", value_parser = crate::up::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    tls: crate::tls::ClientTls,
}

pub async fn run(args: IdsArgs) -> anyhow::Result<()> {
    let mut config = ClientConfig::new(args.url.clone());
    config.backups = args.backups.clone();
    config.registry_url = args.registry.clone();
    config.request_timeout_ms = args.timeout.as_millis().max(1) as u64;
    config.probe_interval_ms = args.interval.as_millis().clamp(100, 5_000) as u64;
    // One process, one round at a time: a buffer would only age.
    config.prefetch.batch = 0;
    config.tls = args.tls.section();
    let client = Client::new(config).await?;
    if !args.watch {
        return round(&client, &args).await;
    }
    let stop = idgen_server::cli::shutdown_signal();
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = ticks.tick() => {
                if let Err(error) = round(&client, &args).await {
                    eprintln!("idgen ids: {error:#}");
                }
            }
        }
    }
}

async fn round(client: &Client, args: &IdsArgs) -> anyhow::Result<()> {
    let lines: Vec<String> = if args.uuid {
        let uuids = client.next_uuids(args.count).await?;
        let endpoint = client.endpoint();
        uuids
            .iter()
            .map(|uuid| match args.json {
                true => serde_json::json!({ "id": uuid.to_string(), "endpoint": endpoint }).to_string(),
                false => uuid.to_string(),
            })
            .collect()
    } else {
        let ids = match args.count {
            1 => vec![client.next_id().await?],
            count => client.next_ids(count).await?,
        };
        let endpoint = client.endpoint();
        ids.iter()
            .map(|id| match args.json {
                true => describe(client, *id, endpoint, args.registry.is_some()).to_string(),
                false => id.to_string(),
            })
            .collect()
    };
    let mut out = lines.join("\n");
    out.push('\n');
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// The ID and where it came from; its fields only when the registry's schedule is known (the
/// built-in one may not be the registry's).
fn describe(client: &Client, id: u64, endpoint: &str, decode: bool) -> serde_json::Value {
    let mut line = serde_json::json!({ "id": id.to_string(), "endpoint": endpoint });
    if decode && let Ok(fields) = client.decode(id) {
        line["layout"] = fields.layout.into();
        line["created_at"] = idgen::core::format_unix_ms(fields.created_at_unix_ms).into();
        line["machine"] = fields.machine.into();
        line["sequence"] = fields.sequence.into();
        if let Some(number) = fields.region_number {
            line["region_number"] = number.into();
        }
        if let Some(region) = fields.region {
            line["region"] = region.into();
        }
    }
    line
}
