//! UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, version 7, and 74 bits that are random
//! except for a counter that keeps one generator's UUIDs increasing within a millisecond.
//!
//! Layout used here (RFC 9562 §6.2, method 1, "fixed bit-length dedicated counter"): a 42-bit
//! counter fills `rand_a` (12 bits) and the top 30 bits of `rand_b`; the last 32 bits are random.
//! The counter is re-seeded with random bits (top bit clear, so it has room to grow) whenever the
//! millisecond moves on. The clock rules are those of every ID (SPEC §3). The randomness comes in as arguments: the core reads no entropy source.

use thiserror::Error;

use crate::generator::{NotNow, Refusal, WaitCause};

const COUNTER_BITS: u32 = 42;

#[derive(Debug, Clone, Default)]
pub struct UuidV7State {
    last_unix_ms: i64,
    counter: u64,
}

impl UuidV7State {
    /// The next UUID, under the clock rules of SPEC §3 like every ID: a clock behind the last
    /// millisecond used by at most `max_wait_behind_ms` is waited out, further back it is refused
    /// (the UUIDs would otherwise carry a stale, possibly far-future time); a used-up counter
    /// waits for the next millisecond. `seed` re-seeds the counter on a new millisecond; `tail`
    /// fills the last 32 bits. UUIDs from one state strictly increase.
    pub fn next(
        &mut self,
        now_unix_ms: i64,
        max_wait_behind_ms: i64,
        seed: u64,
        tail: u32,
    ) -> Result<[u8; 16], NotNow> {
        if now_unix_ms > self.last_unix_ms {
            self.last_unix_ms = now_unix_ms;
            self.counter = seed & ((1 << (COUNTER_BITS - 1)) - 1);
        } else if now_unix_ms == self.last_unix_ms {
            if (self.counter + 1) >> COUNTER_BITS != 0 {
                return Err(NotNow::Wait { until_unix_ms: now_unix_ms + 1, cause: WaitCause::SequenceExhausted });
            }
            self.counter += 1;
        } else {
            let behind_ms = self.last_unix_ms - now_unix_ms;
            return Err(if behind_ms <= max_wait_behind_ms {
                NotNow::Wait { until_unix_ms: self.last_unix_ms, cause: WaitCause::ClockBehind }
            } else {
                NotNow::Refuse(Refusal::ClockBehind { behind_ms })
            });
        }
        Ok(encode(self.last_unix_ms, self.counter, tail))
    }
}

/// One UUIDv7 on its own (no ordering with any other): for callers that keep no state, such as
/// a store minting one public ID at a time.
pub fn new_v7(unix_ms: i64, seed: u64, tail: u32) -> [u8; 16] {
    encode(unix_ms, seed & ((1 << (COUNTER_BITS - 1)) - 1), tail)
}

fn encode(unix_ms: i64, counter: u64, tail: u32) -> [u8; 16] {
    let ms = (unix_ms as u64) & 0xffff_ffff_ffff;
    let rand_a = (counter >> 30) & 0xfff;
    let counter_low = counter & 0x3fff_ffff;
    let high = (ms << 16) | (0x7 << 12) | rand_a;
    let low = (0b10 << 62) | (counter_low << 32) | u64::from(tail);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&high.to_be_bytes());
    bytes[8..].copy_from_slice(&low.to_be_bytes());
    bytes
}

/// `xxxxxxxx-xxxx-7xxx-xxxx-xxxxxxxxxxxx`, lowercase.
pub fn format(bytes: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*bytes).hyphenated().to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UuidError {
    #[error("not a UUID: expected 8-4-4-4-12 hexadecimal digits")]
    Malformed,
    #[error("a UUID, but version {0}, not 7")]
    NotVersion7(u8),
    #[error("a UUID, but not of the RFC 9562 variant")]
    WrongVariant,
}

/// Parses the hyphenated form (either case) and returns the bytes of a UUIDv7. The `uuid` crate
/// also reads the simple, braced and URN forms; 36 bytes can only be the hyphenated one, which is
/// all the API has ever accepted.
pub fn parse_v7(text: &str) -> Result<[u8; 16], UuidError> {
    if text.len() != 36 {
        return Err(UuidError::Malformed);
    }
    let parsed = uuid::Uuid::try_parse(text).map_err(|_| UuidError::Malformed)?;
    let version = parsed.get_version_num() as u8;
    if version != 7 {
        return Err(UuidError::NotVersion7(version));
    }
    if parsed.get_variant() != uuid::Variant::RFC4122 {
        return Err(UuidError::WrongVariant);
    }
    Ok(parsed.into_bytes())
}

/// The Unix-millisecond timestamp in a UUIDv7's first 48 bits.
pub fn unix_ms(bytes: &[u8; 16]) -> i64 {
    bytes[..6].iter().fold(0i64, |acc, &b| (acc << 8) | i64::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_fields() {
        let mut state = UuidV7State::default();
        let bytes = state.next(1_790_424_000_000, 5, 12345, 0xdead_beef).unwrap();
        let text = format(&bytes);
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "7");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"));
        assert_eq!(parse_v7(&text).unwrap(), bytes);
        assert_eq!(parse_v7(&text.to_uppercase()).unwrap(), bytes);
        assert_eq!(unix_ms(&bytes), 1_790_424_000_000);
        assert_eq!(unix_ms(&new_v7(1_790_424_000_001, u64::MAX, 7)), 1_790_424_000_001);
    }

    #[test]
    fn increasing_within_a_millisecond_and_across_a_small_step_back() {
        let mut state = UuidV7State::default();
        let mut previous = state.next(1000, 5, u64::MAX, 0).unwrap();
        for (i, now) in [1000, 1000, 1001, 1001, 1002].into_iter().enumerate() {
            let next = state.next(now, 5, u64::MAX - i as u64, u32::MAX).unwrap();
            assert!(next > previous, "{} then {}", format(&previous), format(&next));
            previous = next;
        }
        // 3 ms back: wait until the last millisecond comes round again, then carry on from it.
        assert_eq!(state.next(999, 5, 1, 1), Err(NotNow::Wait { until_unix_ms: 1002, cause: WaitCause::ClockBehind }));
        let next = state.next(1002, 5, 1, 1).unwrap();
        assert!(next > previous);
        assert_eq!(unix_ms(&next), 1002);
    }

    #[test]
    fn a_clock_far_behind_is_refused_not_papered_over() {
        // Before, a step back kept issuing under the last millisecond: after a step back from a
        // clock that ran an hour ahead, UUIDs carried that hour-ahead time until real time caught up.
        let mut state = UuidV7State::default();
        state.next(1_000_000 + 3_600_000, 5, 1, 1).unwrap();
        assert_eq!(state.next(1_000_000, 5, 2, 2), Err(NotNow::Refuse(Refusal::ClockBehind { behind_ms: 3_600_000 })));
        assert!(state.next(1_000_000 + 3_600_000, 5, 3, 3).is_ok(), "issues again once the clock has caught up");
    }

    #[test]
    fn a_used_up_counter_waits_for_the_next_millisecond() {
        let mut state = UuidV7State::default();
        state.next(1000, 5, u64::MAX, 0).unwrap();
        state.counter = (1 << COUNTER_BITS) - 1;
        assert_eq!(
            state.next(1000, 5, 0, 0),
            Err(NotNow::Wait { until_unix_ms: 1001, cause: WaitCause::SequenceExhausted })
        );
        assert_eq!(unix_ms(&state.next(1001, 5, 0, 0).unwrap()), 1001);
    }

    #[test]
    fn malformed_uuids_are_rejected() {
        assert_eq!(parse_v7("0190"), Err(UuidError::Malformed));
        assert_eq!(parse_v7("0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f0g0h"), Err(UuidError::Malformed));
        assert_eq!(parse_v7("0190a0b0-c0d0-4e0f-8a0b-0c0d0e0f0a0b"), Err(UuidError::NotVersion7(4)));
        assert_eq!(parse_v7("0190a0b0-c0d0-7e0f-0a0b-0c0d0e0f0a0b"), Err(UuidError::WrongVariant));
        assert_eq!(parse_v7("0190a0b0c0d07e0f8a0b0c0d0e0f0a0b0000"), Err(UuidError::Malformed));
    }
}
