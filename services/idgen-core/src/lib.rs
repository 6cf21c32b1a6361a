//! The pure core of idgen: ID layouts, the layout schedule, encoding and decoding, UUIDv7, and the
//! generator state machine with its lease fence and clock rules.
//!
//! Nothing here reads a clock, sleeps or does I/O. Every decision takes `now` (Unix milliseconds by
//! the caller's wall clock) as an argument and returns what to do: issue, wait until a given
//! millisecond, or refuse with a reason. That is what lets the simulation in `tests/` replay any
//! interleaving of clock steps, freezes and lost leases deterministically.

pub mod generator;
pub mod layout;
pub mod schedule;
pub mod text;
pub mod time;
pub mod typeid;
pub mod uuid;

pub use generator::{
    ConfigError, Generator, GeneratorConfig, InstallError, Lease, LeaseView, MAX_WAIT_BEHIND_LIMIT_MS, NotNow, Refusal,
    Release, Run, WaitCause,
};
pub use layout::{DecodedId, FieldError, Layout, MachineNumber, RegionNumber, Sequence};
pub use schedule::{
    DEFAULT_V2_FROM, DecodeError, OPEN_HORIZON, Schedule, ScheduleChange, ScheduleEntry, ScheduleError,
};
pub use text::{IdText, IdTextError, parse_id};
pub use time::{EPOCH_UNIX_MS, MAX_TIMESTAMP, Timestamp, TimestampError, format_unix_ms, parse_rfc3339_ms};
