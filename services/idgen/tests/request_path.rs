//! The request path's clock rules, driven by a manual clock: a step back while a request waits
//! for the next millisecond, and the kernel's sync state, read in every millisecond that issues.

use std::sync::Arc;
use std::time::Duration;

use idgen::core::{Generator, GeneratorConfig, Lease, OPEN_HORIZON, Refusal, Schedule};
use idgen::{GeneratorMetrics, IdGenerator, ManualClock, SyncStatus};

const T0: i64 = 1_790_424_000_000;

fn generator(clock: &Arc<ManualClock>) -> Arc<IdGenerator> {
    let mut core = Generator::new(
        GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 },
        Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
        0,
        true,
    )
    .unwrap();
    let lease = Lease { layout: "v1".into(), machine: 3, epoch: 1, expiry_unix_ms: T0 + 300_000, floor_unix_ms: T0 };
    core.install_lease(lease).unwrap();
    Arc::new(IdGenerator::new(core, clock.clone(), Arc::new(GeneratorMetrics::default())))
}

#[tokio::test(start_paused = true)]
async fn a_clock_step_back_during_a_wait_is_refused_not_slept_out() {
    // Before, a request waiting for the next millisecond slept until the wall clock got there:
    // after a 10 s step back, 10 s. SPEC §3: refuse at once when more than 5 ms behind.
    let clock = Arc::new(ManualClock::new(T0));
    let g = generator(&clock);
    assert_eq!(g.next_ids(4_096).await.unwrap().len(), 4_096, "T0's sequence is used up");
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_id().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "waiting for T0 + 1");
    clock.set(T0 - 10_000);
    let answered = tokio::time::timeout(Duration::from_millis(20), waiting).await;
    let result = answered.expect("answered within a few milliseconds, not after the step").unwrap();
    assert_eq!(result, Err(Refusal::ClockBehind { behind_ms: 10_000 }));
    // A step back within the rule is still waited out.
    clock.set(T0 + 1);
    g.next_id().await.unwrap();
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_ids(4_096).await }
    });
    tokio::task::yield_now().await;
    clock.set(T0 - 2);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiting.is_finished(), "2 ms behind: still waiting");
    clock.set(T0 + 2);
    let ids = tokio::time::timeout(Duration::from_millis(20), waiting).await.unwrap().unwrap().unwrap();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test]
async fn the_kernel_saying_unsynchronized_stops_the_next_millisecond_without_a_keeper() {
    // Before, only the lease keeper's tick (once a second) told the generator: up to a second of
    // IDs after the kernel reported STA_UNSYNC. Now every millisecond that issues reads it.
    let clock = Arc::new(ManualClock::new(T0));
    clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    let g = generator(&clock);
    g.next_id().await.unwrap();
    clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    clock.advance(1);
    let refused = Refusal::ClockUnsynchronized { reason: "STA_UNSYNC".into() };
    assert_eq!(g.next_id().await, Err(refused.clone()));
    assert_eq!(g.next_ids(10).await, Err(refused));
    assert_eq!(g.next_uuids(1).await, Err(Refusal::ClockUnsynchronized { reason: "STA_UNSYNC".into() }));
    assert!(matches!(g.health(), idgen::Health::Refusing { refusal: Refusal::ClockUnsynchronized { .. }, .. }));
    clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    clock.advance(1);
    assert!(g.next_id().await.is_ok(), "and issues again once the kernel says synchronized");
}

#[tokio::test(start_paused = true)]
async fn uuids_follow_the_clock_rules_of_ids() {
    let clock = Arc::new(ManualClock::new(T0));
    let g = generator(&clock);
    let first = g.next_uuids(3).await.unwrap();
    assert!(first.windows(2).all(|w| w[0] < w[1]));
    clock.set(T0 - 60_000);
    assert_eq!(g.next_uuids(1).await, Err(Refusal::ClockBehind { behind_ms: 60_000 }));
    clock.set(T0 - 3);
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_uuids(1).await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "3 ms behind: waits");
    clock.set(T0);
    let next = tokio::time::timeout(Duration::from_millis(20), waiting).await.unwrap().unwrap().unwrap();
    assert!(next[0] > first[2]);
}
