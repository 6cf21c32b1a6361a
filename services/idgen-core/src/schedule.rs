//! The layout schedule: which layout an ID has is decided by its timestamp.
//!
//! A schedule is a list of `(layout, from)` entries, the first from the epoch, and a horizon: the
//! registry promises no cutover before the horizon, so a generator refuses any timestamp at or past
//! the horizon of the copy it holds. A generator that missed a new layout can therefore never issue
//! an ID under the wrong one.

use thiserror::Error;

use crate::layout::{DecodedId, LOW_BITS, Layout};
use crate::time::{MAX_TIMESTAMP, Timestamp};

/// The v2 cutover of the default schedule: 2028-01-01T00:00:00Z, in ms since the epoch.
pub const DEFAULT_V2_FROM: u64 = 63_072_000_000;

/// A horizon past every representable timestamp: "no cutover will ever be added".
pub const OPEN_HORIZON: u64 = MAX_TIMESTAMP + 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleEntry {
    pub layout: Layout,
    pub from: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    entries: Vec<ScheduleEntry>,
    /// Exclusive bound, in ms since the epoch (≤ 2^41).
    horizon: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("a schedule needs at least one layout")]
    Empty,
    #[error("the first layout must start at the epoch (from 0), not {0}")]
    FirstNotAtEpoch(u64),
    #[error("layout {name} starts at {from}, not strictly after the layout before it ({previous})")]
    NotIncreasing { name: String, from: u64, previous: u64 },
    #[error("layout name {0} appears twice")]
    DuplicateName(String),
    #[error("horizon {0} is past the end of the timestamp range")]
    HorizonOutOfRange(u64),
}

/// Why a newer copy of the schedule cannot replace the one held.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScheduleChange {
    #[error("the offered schedule's horizon {offered} is before the held one {held}")]
    HorizonBackwards { held: u64, offered: u64 },
    #[error("the offered schedule changes layouts that start before the held horizon")]
    RewritesThePast,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("bit 63 is set: {0} is not a 63-bit ID")]
    SignBit(u64),
}

impl Schedule {
    pub fn new(entries: Vec<ScheduleEntry>, horizon: u64) -> Result<Self, ScheduleError> {
        let first = entries.first().ok_or(ScheduleError::Empty)?;
        if first.from != Timestamp::ZERO {
            return Err(ScheduleError::FirstNotAtEpoch(first.from.millis()));
        }
        for pair in entries.windows(2) {
            if pair[1].from <= pair[0].from {
                return Err(ScheduleError::NotIncreasing {
                    name: pair[1].layout.name().to_owned(),
                    from: pair[1].from.millis(),
                    previous: pair[0].from.millis(),
                });
            }
        }
        for (i, entry) in entries.iter().enumerate() {
            if entries[..i].iter().any(|e| e.layout.name() == entry.layout.name()) {
                return Err(ScheduleError::DuplicateName(entry.layout.name().to_owned()));
            }
        }
        if horizon > OPEN_HORIZON {
            return Err(ScheduleError::HorizonOutOfRange(horizon));
        }
        Ok(Schedule { entries, horizon })
    }

    /// v1 from the epoch, v2 from 2028-01-01T00:00:00Z, with the given horizon.
    pub fn default_with_horizon(horizon: u64) -> Result<Self, ScheduleError> {
        Schedule::new(
            vec![
                ScheduleEntry { layout: Layout::v1(), from: Timestamp::ZERO },
                ScheduleEntry {
                    layout: Layout::v2(),
                    from: Timestamp::from_millis(DEFAULT_V2_FROM).expect("2028 fits in 41 bits"),
                },
            ],
            horizon,
        )
    }

    /// Whether `newer` may replace this copy. The past cannot change: every entry that starts
    /// before this copy's horizon must be the same in both, and the horizon never moves back.
    /// Two copies that break this rule, in use at once, could give one millisecond two layouts.
    pub fn check_successor(&self, newer: &Schedule) -> Result<(), ScheduleChange> {
        let horizon = self.horizon;
        if newer.horizon < horizon {
            return Err(ScheduleChange::HorizonBackwards { held: horizon, offered: newer.horizon });
        }
        let settled = |s: &Schedule| -> Vec<ScheduleEntry> {
            s.entries.iter().filter(|e| e.from.millis() < horizon).cloned().collect()
        };
        if settled(newer) != settled(self) {
            return Err(ScheduleChange::RewritesThePast);
        }
        Ok(())
    }

    pub fn entries(&self) -> &[ScheduleEntry] {
        &self.entries
    }

    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    /// The entry an ID with this timestamp belongs to: the last whose `from` ≤ the timestamp.
    pub fn entry_at(&self, timestamp: Timestamp) -> &ScheduleEntry {
        let index = self.entries.partition_point(|e| e.from <= timestamp);
        // The first entry starts at 0, so index ≥ 1.
        &self.entries[index - 1]
    }

    /// The entry after the one in force at `timestamp`, if any: the next cutover.
    pub fn next_after(&self, timestamp: Timestamp) -> Option<&ScheduleEntry> {
        self.entries.iter().find(|e| e.from > timestamp)
    }

    pub fn layout(&self, name: &str) -> Option<&Layout> {
        self.entries.iter().map(|e| &e.layout).find(|l| l.name() == name)
    }

    /// Takes a 63-bit ID apart by the layout its timestamp selects.
    pub fn decode(&self, id: u64) -> Result<DecodedId, DecodeError> {
        if id >> 63 != 0 {
            return Err(DecodeError::SignBit(id));
        }
        let timestamp = Timestamp::from_millis(id >> LOW_BITS).expect("a 63-bit ID has a 41-bit timestamp");
        let layout = &self.entry_at(timestamp).layout;
        let (region, machine, sequence) = layout.decode_fields(id);
        Ok(DecodedId {
            id,
            layout: layout.clone(),
            timestamp,
            region_number: (layout.region_bits() > 0).then_some(region),
            machine,
            sequence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::format_unix_ms;

    #[test]
    fn spec_test_vectors_decode_exactly() {
        let schedule = Schedule::default_with_horizon(OPEN_HORIZON).unwrap();

        let d = schedule.decode(97_301_141_913_751_557).unwrap();
        assert_eq!(d.layout.name(), "v1");
        assert_eq!(format_unix_ms(d.timestamp.unix_ms()), "2026-09-26T12:00:00.000Z");
        assert_eq!((d.region_number, d.machine, d.sequence), (None, 37, 5));

        let d = schedule.decode(683_244_571_854_022_659).unwrap();
        assert_eq!(d.layout.name(), "v2");
        assert_eq!(format_unix_ms(d.timestamp.unix_ms()), "2031-03-01T09:30:00.000Z");
        assert_eq!((d.region_number, d.machine, d.sequence), (Some(2), 170, 3));
    }

    #[test]
    fn cutover_is_chosen_by_timestamp() {
        let schedule = Schedule::default_with_horizon(OPEN_HORIZON).unwrap();
        let just_before = Timestamp::from_millis(DEFAULT_V2_FROM - 1).unwrap();
        let at = Timestamp::from_millis(DEFAULT_V2_FROM).unwrap();
        assert_eq!(schedule.entry_at(just_before).layout.name(), "v1");
        assert_eq!(schedule.entry_at(at).layout.name(), "v2");
        assert_eq!(schedule.entry_at(Timestamp::MAX).layout.name(), "v2");
        assert_eq!(schedule.next_after(just_before).unwrap().layout.name(), "v2");
        assert!(schedule.next_after(at).is_none());
        assert_eq!(format_unix_ms(at.unix_ms()), "2028-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_third_layout_needs_no_code_change() {
        let mut entries = Schedule::default_with_horizon(OPEN_HORIZON).unwrap().entries().to_vec();
        let v3_from = Timestamp::from_millis(DEFAULT_V2_FROM * 2).unwrap();
        entries.push(ScheduleEntry { layout: Layout::new("v3", 4, 8, 10).unwrap(), from: v3_from });
        let schedule = Schedule::new(entries, OPEN_HORIZON).unwrap();
        let id = (v3_from.millis() << 22) | (9 << 18) | (200 << 10) | 7;
        let d = schedule.decode(id).unwrap();
        assert_eq!((d.layout.name(), d.region_number, d.machine, d.sequence), ("v3", Some(9), 200, 7));
    }

    #[test]
    fn bad_schedules_are_rejected() {
        let v1 = ScheduleEntry { layout: Layout::v1(), from: Timestamp::ZERO };
        let late = ScheduleEntry { layout: Layout::v2(), from: Timestamp::ZERO };
        assert_eq!(Schedule::new(vec![], OPEN_HORIZON), Err(ScheduleError::Empty));
        assert!(matches!(
            Schedule::new(vec![v1.clone(), late], OPEN_HORIZON),
            Err(ScheduleError::NotIncreasing { .. })
        ));
        assert!(matches!(Schedule::new(vec![v1.clone()], OPEN_HORIZON + 1), Err(ScheduleError::HorizonOutOfRange(_))));
        assert_eq!(schedule_sign_bit(), Err(DecodeError::SignBit(1 << 63)));
    }

    fn schedule_sign_bit() -> Result<DecodedId, DecodeError> {
        Schedule::default_with_horizon(OPEN_HORIZON).unwrap().decode(1 << 63)
    }
}
