//! The client against one worker, in one run: `next_id()` from a warm prefetch buffer, and
//! sustained IDs per second through a prefetching client beside a client that calls
//! `POST /v1/ids` for every ID (`prefetch.batch = 0`), with 1 and 32 callers. `scripts/bench`
//! (stage 5) starts the worker and runs this on the other core; by hand:
//!
//! ```sh
//! cargo run --release -p idgen-client --example bench_client -- http://127.0.0.1:8701 [seconds] [rounds]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idgen_client::{Client, ClientConfig};

/// A client of `url` with prefetch batches of `batch` (0: one request per ID).
async fn client(url: &str, batch: u32) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(url);
    config.prefetch.batch = batch;
    config.prefetch.low_water = batch / 2;
    Ok(Client::new(config).await?)
}

/// IDs per second through `client` with `callers` concurrent callers for `run`, and errors.
async fn sustained(client: &Arc<Client>, callers: usize, run: Duration) -> (f64, u64) {
    let (ids, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (client, ids, errors) = (client.clone(), ids.clone(), errors.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    match client.next_id().await {
                        Ok(id) => {
                            std::hint::black_box(id);
                            ids.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller task");
    }
    (ids.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(), errors.load(Ordering::Relaxed))
}

/// Nanoseconds per `next_id()` served from a buffer that holds enough: chunks of 400 calls, each
/// begun once the buffer holds at least 900 (a refill is asked for at 500), for `run`.
async fn warm(client: &Client, run: Duration) -> anyhow::Result<f64> {
    let deadline = Instant::now() + run;
    let mut per_call = Vec::new();
    while Instant::now() < deadline {
        // Untimed: draw the buffer down to the low-water mark, which starts a refill, and give
        // the refill time to arrive.
        while client.buffered() < 900 {
            client.next_id().await?;
            if client.buffered() <= 500 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let start = Instant::now();
        for _ in 0..400 {
            std::hint::black_box(client.next_id().await?);
        }
        per_call.push(start.elapsed().as_nanos() as f64 / 400.0);
    }
    Ok(median(per_call))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or_else(|| anyhow::anyhow!("usage: bench_client URL [seconds] [rounds]"))?;
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let run = Duration::from_secs_f64(seconds);
    // Two runtime threads: the callers on one, the background refill free to run on the other.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let prefetching = Arc::new(client(&url, 1_000).await?);
        let per_id = Arc::new(client(&url, 0).await?);
        // Warm-up: connections open, the first batch in.
        sustained(&prefetching, 4, Duration::from_millis(500)).await;
        sustained(&per_id, 4, Duration::from_millis(500)).await;

        let mut warm_ns = Vec::new();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 4];
        let mut errors = 0;
        for _ in 0..rounds {
            warm_ns.push(warm(&prefetching, run).await?);
            for (i, (client, callers)) in
                [(&prefetching, 1), (&per_id, 1), (&prefetching, 32), (&per_id, 32)].into_iter().enumerate()
            {
                let (rate, failed) = sustained(client, callers, run).await;
                rates[i].push(rate);
                errors += failed;
            }
        }
        let warm_ns = median(warm_ns);
        let rate: Vec<f64> = rates.into_iter().map(median).collect();
        println!("client: {rounds} alternated rounds of {seconds} s per measurement");
        println!("  next_id() from a warm buffer      {warm_ns:>10.1} ns/ID");
        for (i, callers) in [1, 32].into_iter().enumerate() {
            let (pre, one) = (rate[2 * i], rate[2 * i + 1]);
            println!(
                "  {callers:>2} caller{} prefetching (batch 1000) {pre:>10.0} IDs/s",
                if callers == 1 { " " } else { "s" }
            );
            println!(
                "  {callers:>2} caller{} POST /v1/ids per ID       {one:>10.0} IDs/s",
                if callers == 1 { " " } else { "s" }
            );
            println!("  RATIO client prefetching / per-ID requests, {callers} caller(s): {:.1}", pre / one);
        }
        if errors > 0 {
            println!("  ({errors} calls failed)");
        }
        anyhow::Ok(())
    })
}
