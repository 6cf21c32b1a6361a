//! The core generator against its baseline, `SystemTime::now()` alone, in the same run.
//!
//! `cargo bench -p idgen-core` prints each; the ratio of "one ID" to "SystemTime::now()" is the
//! number to watch: a request reads the clock once, so the generator should cost about as much.

use std::hint::black_box;
use std::time::{SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use idgen_core::{Generator, GeneratorConfig, Lease, NotNow, OPEN_HORIZON, Schedule};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

fn generator() -> Generator {
    let mut g =
        Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 0, true)
            .unwrap();
    let now = now_ms();
    g.install_lease(Lease {
        layout: "v1".into(),
        machine: 1,
        epoch: 1,
        expiry_unix_ms: now + 30 * 86_400_000,
        floor_unix_ms: now,
    })
    .unwrap();
    g
}

/// Issues `want` IDs, reading the clock once per call as a request does. The bench issues far
/// faster than 4,096 IDs per wall-clock millisecond, so when a millisecond is used up it moves on
/// to the next without waiting (`ahead` keeps later readings from going behind it): this measures
/// the generator, not the sequence cap.
fn issue(g: &mut Generator, ahead: &mut i64, want: u32, out: &mut Vec<u64>) {
    let mut now = now_ms().max(*ahead);
    while out.len() < want as usize {
        match g.issue(now, want - out.len() as u32) {
            Ok(run) => out.extend(run.ids()),
            Err(NotNow::Wait { until_unix_ms, .. }) => {
                now = until_unix_ms;
                *ahead = until_unix_ms;
            }
            Err(NotNow::Refuse(refusal)) => panic!("{refusal}"),
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("generator");
    group.bench_function("SystemTime::now() (baseline)", |b| b.iter(|| black_box(now_ms())));
    let mut g = generator();
    let mut out = Vec::with_capacity(1000);
    let mut ahead = 0;
    group.bench_function("one ID", |b| {
        b.iter(|| {
            out.clear();
            issue(&mut g, &mut ahead, 1, &mut out);
            black_box(out[0])
        })
    });
    group.bench_function("batch of 1,000", |b| {
        b.iter(|| {
            out.clear();
            issue(&mut g, &mut ahead, 1000, &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
