//! Timestamps: 41 bits of milliseconds since the custom epoch 2026-01-01T00:00:00Z.

use thiserror::Error;

/// 2026-01-01T00:00:00Z in Unix milliseconds.
pub const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

/// The largest timestamp a 41-bit field holds: 2095-09-07T15:47:35.551Z.
pub const MAX_TIMESTAMP: u64 = (1 << 41) - 1;

/// Milliseconds since the custom epoch, known to fit in 41 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TimestampError {
    #[error("{unix_ms} Unix ms is before the epoch 2026-01-01T00:00:00Z")]
    BeforeEpoch { unix_ms: i64 },
    #[error("{unix_ms} Unix ms is past the last representable timestamp 2095-09-07T15:47:35.551Z")]
    PastEnd { unix_ms: i64 },
}

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(MAX_TIMESTAMP);

    /// The timestamp of a Unix-millisecond instant, if it lies inside the 41-bit range.
    pub fn from_unix_ms(unix_ms: i64) -> Result<Self, TimestampError> {
        let since = unix_ms.checked_sub(EPOCH_UNIX_MS).ok_or(TimestampError::BeforeEpoch { unix_ms })?;
        if since < 0 {
            return Err(TimestampError::BeforeEpoch { unix_ms });
        }
        if since as u64 > MAX_TIMESTAMP {
            return Err(TimestampError::PastEnd { unix_ms });
        }
        Ok(Timestamp(since as u64))
    }

    /// A raw millisecond count since the epoch; `None` if it does not fit in 41 bits.
    pub fn from_millis(millis: u64) -> Option<Self> {
        (millis <= MAX_TIMESTAMP).then_some(Timestamp(millis))
    }

    pub fn millis(self) -> u64 {
        self.0
    }

    pub fn unix_ms(self) -> i64 {
        self.0 as i64 + EPOCH_UNIX_MS
    }
}

/// Formats Unix milliseconds as `2026-09-26T12:00:00.000Z` (UTC, millisecond precision).
///
/// Written out here (civil-from-days, after Howard Hinnant) so the core needs no date crate.
pub fn format_unix_ms(unix_ms: i64) -> String {
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let hour = ms_of_day / 3_600_000;
    let minute = ms_of_day / 60_000 % 60;
    let second = ms_of_day / 1000 % 60;
    let milli = ms_of_day % 1000;
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.sss]Z` (UTC only, at most millisecond precision) to Unix ms.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')))
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let millis = match &b[19..] {
        b"Z" => 0,
        [b'.', rest @ .., b'Z'] if (1..=3).contains(&rest.len()) => {
            digits(20..20 + rest.len())? * 10i64.pow(3 - rest.len() as u32)
        }
        _ => return None,
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if !(1..=12).contains(&month)
        || day < 1
        || day > month_days[month as usize - 1]
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month as u32, day as u32);
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_and_end_format_as_the_spec_says() {
        assert_eq!(format_unix_ms(EPOCH_UNIX_MS), "2026-01-01T00:00:00.000Z");
        assert_eq!(format_unix_ms(Timestamp::MAX.unix_ms()), "2095-09-07T15:47:35.551Z");
        assert_eq!(format_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_unix_ms(1_790_424_000_000), "2026-09-26T12:00:00.000Z");
    }

    #[test]
    fn rfc3339_round_trips() {
        for ms in [0, EPOCH_UNIX_MS, 1_790_424_000_000, 1_830_297_600_000, Timestamp::MAX.unix_ms(), 951_782_400_123] {
            assert_eq!(parse_rfc3339_ms(&format_unix_ms(ms)), Some(ms), "{}", format_unix_ms(ms));
        }
        assert_eq!(parse_rfc3339_ms("2028-01-01T00:00:00Z"), Some(EPOCH_UNIX_MS + 63_072_000_000));
        assert_eq!(parse_rfc3339_ms("2026-09-26T12:00:00.5Z"), Some(1_790_424_000_500));
        for bad in [
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00+01:00",
            "",
            "tomorrow",
            "2026-01-01T00:00:00.1234Z",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn range_is_enforced() {
        assert!(Timestamp::from_unix_ms(EPOCH_UNIX_MS - 1).is_err());
        assert_eq!(Timestamp::from_unix_ms(EPOCH_UNIX_MS).unwrap(), Timestamp::ZERO);
        assert_eq!(Timestamp::from_unix_ms(Timestamp::MAX.unix_ms()).unwrap(), Timestamp::MAX);
        assert_eq!(
            Timestamp::from_unix_ms(Timestamp::MAX.unix_ms() + 1),
            Err(TimestampError::PastEnd { unix_ms: Timestamp::MAX.unix_ms() + 1 })
        );
        assert!(Timestamp::from_unix_ms(i64::MIN).is_err());
    }
}
