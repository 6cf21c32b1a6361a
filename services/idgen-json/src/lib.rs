//! What every idgen service reads of a JSON body the same way: the body itself ([`body`], an
//! object read into a typed struct, each refusal with its code) and a whole JSON number. It
//! depends on serde alone, so the fuzz targets that compile a service's body reader in as it is
//! depend on this crate too, and test the same code the services run.
//!
//! A whole number: JSON does not tell `8` from `8.0` or `8e0`, and JSON Schema's `integer` takes all three: each
//! is the whole number 8. A number written with a fraction or an exponent is read as a double,
//! which is exact only up to 2^53 − 1, so such a number above that is refused as inexact rather
//! than read as the nearest double. A number with a fraction is what a double reads of it, as
//! for JSON Schema's validators and JavaScript: `1.0000000000000000001` is 1. What a service does
//! with a refusal (its error code, its message, its advice) is the service's own.

pub mod body;

use serde_json::Value;

/// The largest integer every JSON reader holds exactly (JavaScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a JSON value is not a whole number this reader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotWhole {
    /// Not a JSON number at all (a string, `null`, an array, …).
    NotANumber,
    /// Below zero.
    Negative,
    /// A number with a fractional part (`1.5`).
    Fraction,
    /// Whole, but written as a double above 2^53 − 1 (`1e19`, `9007199254740993.0`), where a
    /// double no longer holds every whole number: what it names may not be what was meant.
    Inexact,
}

/// A non-negative whole JSON number: an integer as written (any `u64`), or one written with a
/// fraction or an exponent up to [`MAX_SAFE_INTEGER`].
pub fn whole_number(value: &Value) -> Result<u64, NotWhole> {
    let Value::Number(number) = value else { return Err(NotWhole::NotANumber) };
    if let Some(n) = number.as_u64() {
        return Ok(n);
    }
    if let Some(i) = number.as_i64() {
        return if i == 0 { Ok(0) } else { Err(NotWhole::Negative) };
    }
    let Some(f) = number.as_f64() else { return Err(NotWhole::NotANumber) };
    if f.fract() != 0.0 || !f.is_finite() {
        Err(NotWhole::Fraction)
    } else if f < 0.0 {
        Err(NotWhole::Negative)
    } else if f > MAX_SAFE_INTEGER as f64 {
        Err(NotWhole::Inexact)
    } else {
        Ok(f as u64)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(text: &str) -> Result<u64, NotWhole> {
        whole_number(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn a_whole_number_however_it_is_written() {
        for text in ["8", "8.0", "8e0", "0.8e1", "80e-1", "8.000"] {
            assert_eq!(read(text), Ok(8), "{text}");
        }
        assert_eq!(read("0"), Ok(0));
        assert_eq!(read("-0"), Ok(0), "-0 is the integer 0");
        assert_eq!(read("-0.0"), Ok(0), "and so is -0.0");
        assert_eq!(read(&u64::MAX.to_string()), Ok(u64::MAX), "an integer as written is exact");
        assert_eq!(read("9007199254740991.0"), Ok(MAX_SAFE_INTEGER));
        // Read exactly (serde_json's `float_roundtrip`): the default reading puts this one ULP
        // off, at 1840754094809076.75, and would refuse a whole number as a fraction.
        assert_eq!(read("1840754094809077.0"), Ok(1_840_754_094_809_077));
    }

    #[test]
    fn what_is_not_a_whole_number_says_why() {
        assert_eq!(read("1.5"), Err(NotWhole::Fraction));
        assert_eq!(read("1e-3"), Err(NotWhole::Fraction));
        assert_eq!(read("-1"), Err(NotWhole::Negative));
        assert_eq!(read("-1.0"), Err(NotWhole::Negative));
        assert_eq!(read("-1e300"), Err(NotWhole::Negative));
        assert_eq!(read("9007199254740992.0"), Err(NotWhole::Inexact));
        assert_eq!(read("1e19"), Err(NotWhole::Inexact));
        assert_eq!(read("18446744073709551616"), Err(NotWhole::Inexact), "above u64: read as a double");
        for value in [json!("8"), json!(null), json!(true), json!([8]), json!({"n": 8})] {
            assert_eq!(whole_number(&value), Err(NotWhole::NotANumber), "{value}");
        }
    }
}
