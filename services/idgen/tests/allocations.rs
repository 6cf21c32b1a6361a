//! `next_id` allocates nothing per call: counted by a global allocator, on the thread that asks.
//! (Before, it built a one-element `Vec` for every ID.) The only allocations left are the
//! millisecond waits once a millisecond's sequence is used up: one per millisecond, not per ID.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use idgen::{EmbeddedGenerator, GeneratorConfig};
use prometheus_client::registry::Registry;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the count is a
// thread-local `Cell`, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[tokio::test(flavor = "current_thread")]
async fn next_id_allocates_nothing_per_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GeneratorConfig::development();
    config.lease.create_tables = true;
    config.clock.require_sync = false;
    config.lease.sqlite_path = Some(dir.path().join("leases.db"));
    let generator = EmbeddedGenerator::start(&config, &mut Registry::default()).await.unwrap();
    generator.ready(Duration::from_secs(10)).await.unwrap();
    for _ in 0..10_000 {
        generator.next_id().await.unwrap();
    }

    const IDS: u64 = 100_000;
    let before = allocations();
    let started = idgen::system_unix_ms();
    let mut last = 0;
    for _ in 0..IDS {
        let id = generator.next_id().await.unwrap();
        assert!(id > last);
        last = id;
    }
    let allocated = allocations() - before;
    let milliseconds = (idgen::system_unix_ms() - started + 1) as u64;
    // 100,000 IDs at 4,096 per millisecond span at least 25 milliseconds; allow a few
    // allocations for each millisecond crossed, none for each ID.
    assert!(
        allocated <= 4 * milliseconds && allocated < IDS / 20,
        "{allocated} allocations for {IDS} IDs over {milliseconds} ms"
    );
    println!("{allocated} allocations for {IDS} IDs over {milliseconds} ms");
    generator.shutdown().await.unwrap();
}
