//! `idgen_json::whole_number`, the one reading of a whole JSON number every service shares,
//! against the text itself: an integer written as one is read exactly (compared digit by digit);
//! any other number is what the standard library's correctly rounded `f64` reading of the text
//! makes of it, accepted exactly when that is a whole number from 0 to 2^53 − 1; and every
//! refusal says the right why.
#![no_main]

use idgen_json::{MAX_SAFE_INTEGER, NotWhole, whole_number};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(value) = serde_json::from_str::<Value>(text) else { return };
    let answer = whole_number(&value);
    let Value::Number(_) = value else {
        assert_eq!(answer, Err(NotWhole::NotANumber), "{text}");
        return;
    };
    let text = text.trim_matches([' ', '\t', '\n', '\r']);
    let integer_literal = !text.contains(['.', 'e', 'E']);
    let double: f64 = text.parse().expect("a JSON number is a Rust f64 literal");
    // The integer's digits without sign or leading zeros ("" for zero).
    let digits = text.trim_start_matches('-').trim_start_matches('0');
    match answer {
        Ok(n) if integer_literal => assert!(n.to_string() == digits || (n == 0 && digits.is_empty()), "{text}: {n}"),
        Ok(n) => assert!(double == n as f64 && n <= MAX_SAFE_INTEGER, "{text}: {n}"),
        Err(NotWhole::NotANumber) => panic!("{text} is a number"),
        Err(NotWhole::Negative) => assert!(double < 0.0 && double.fract() == 0.0, "{text}"),
        Err(NotWhole::Fraction) => assert!(double.fract() != 0.0, "{text}"),
        Err(NotWhole::Inexact) if integer_literal => {
            assert!(!text.starts_with('-') && digits.parse::<u64>().is_err(), "{text}: an integer beyond u64")
        }
        Err(NotWhole::Inexact) => assert!(double.fract() == 0.0 && double > MAX_SAFE_INTEGER as f64, "{text}"),
    }
});
