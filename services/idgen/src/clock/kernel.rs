//! The kernel's word on the clock: its synchronization state and discipline, read through
//! `adjtimex(2)` with `modes = 0` (read, never change).

use super::{Discipline, SyncStatus};

/// The kernel's clock discipline as `adjtimex(2)` reads it (`modes = 0`: read, never change):
/// the clock state it returns and the `timex` it filled.
#[cfg(target_os = "linux")]
pub(crate) fn read_adjtimex() -> std::io::Result<(i32, libc::timex)> {
    // SAFETY: a zeroed timex with modes = 0 asks adjtimex to read, not change, the state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == -1 { Err(std::io::Error::last_os_error()) } else { Ok((state, tx)) }
}

/// The kernel's NTP state via `adjtimex(2)` (read-only: `modes = 0`).
#[cfg(target_os = "linux")]
pub fn kernel_sync_status(max_error_us: i64) -> SyncStatus {
    let (state, tx) = match read_adjtimex() {
        Ok(read) => read,
        Err(error) => return SyncStatus::Unsynchronized(format!("adjtimex failed: {error}")),
    };
    if state == libc::TIME_ERROR || tx.status & libc::STA_UNSYNC != 0 {
        return SyncStatus::Unsynchronized("kernel reports the clock unsynchronized (STA_UNSYNC/TIME_ERROR)".into());
    }
    let estimated_error_us = tx.esterror;
    if estimated_error_us > max_error_us {
        return SyncStatus::Unsynchronized(format!(
            "estimated clock error {} µs exceeds the {} µs limit",
            estimated_error_us, max_error_us
        ));
    }
    SyncStatus::Synchronized { estimated_error_us }
}

/// The kernel's offset and estimated error via `adjtimex(2)` (read-only); `None` if it fails.
#[cfg(target_os = "linux")]
pub fn kernel_discipline() -> Option<Discipline> {
    let (_, tx) = read_adjtimex().ok()?;
    // The offset is in microseconds, or nanoseconds when the kernel says STA_NANO.
    let offset_unit = if tx.status & libc::STA_NANO != 0 { 1e-9 } else { 1e-6 };
    Some(Discipline {
        offset_seconds: tx.offset as f64 * offset_unit,
        estimated_error_seconds: tx.esterror as f64 * 1e-6,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_discipline() -> Option<Discipline> {
    None
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_sync_status(_max_error_us: i64) -> SyncStatus {
    SyncStatus::Unsynchronized("clock synchronization can only be checked on Linux".into())
}

/// The monotonic clock as of the kernel's last tick (`CLOCK_MONOTONIC_COARSE`), in nanoseconds:
/// the clock `Instant` reads, never ahead of it and behind it by at most a tick (1–10 ms), at a
/// fraction of the cost (the vDSO copies a stored value; no counter is read). For stamps that
/// deadlines of seconds are counted from, many times a request.
#[cfg(target_os = "linux")]
pub fn monotonic_coarse_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for clock_gettime to fill; the clock exists on every
    // Linux since 2.6.32 and reading it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    (now.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(now.tv_nsec as u64)
}

/// The monotonic clock (`CLOCK_MONOTONIC`, the one `Instant` reads), in nanoseconds: to place
/// [`monotonic_coarse_ns`] readings against an `Instant` taken beside it.
#[cfg(target_os = "linux")]
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(now.tv_nsec as u64)
}
