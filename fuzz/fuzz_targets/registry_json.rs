//! The schedule a worker or an embedded generator reads: the registry's two answers
//! (`GET /v1/layouts` and `GET /v1/regions`, split at the first NUL byte) and the copy it keeps on
//! disk. Whatever is accepted has a valid schedule, is written back and read again unchanged, and
//! decodes any ID without panicking.
#![no_main]

use std::path::Path;

use idgen::control::registry::RegistrySnapshot;
use libfuzzer_sys::fuzz_target;

fn holds(snapshot: &RegistrySnapshot, id: u64) {
    let schedule = snapshot.schedule().expect("a parsed snapshot has a valid schedule");
    let written = serde_json::to_vec(snapshot).expect("a snapshot serializes");
    let read = RegistrySnapshot::from_cache(&written, Path::new("schedule.json")).expect("what was written reads back");
    assert_eq!(&read, snapshot);
    assert_eq!(read.schedule().expect("valid"), schedule);
    let _ = schedule.decode(id);
}

fuzz_target!(|data: &[u8]| {
    let id = data.iter().rev().take(8).fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    if let Ok(snapshot) = RegistrySnapshot::from_cache(data, Path::new("schedule.json")) {
        holds(&snapshot, id);
    }
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (layouts, regions) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    if let Ok(snapshot) = RegistrySnapshot::from_responses(layouts, regions) {
        holds(&snapshot, id);
    }
});
