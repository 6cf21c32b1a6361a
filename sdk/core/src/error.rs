//! One error for every call: what a binding turns into its language's exceptions.

use idgen::core::Refusal;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The caller's input is not what the call takes (an ID out of range, a count of 0, an
    /// unknown configuration key): Python's `ValueError`, a JavaScript `RangeError`. `code` is
    /// the shared test vectors' name for it.
    #[error("{message}")]
    Invalid { code: &'static str, message: String },
    /// No ID now: the generator refuses (its reason: `lease`, `clock_behind`,
    /// `clock_unsynchronized`, `schedule`, `forked`), the fleet is over the caller's quota
    /// (`over_quota`) or no endpoint answered (`unavailable`). `retry_after_ms` where waiting
    /// helps. Python's `idgen.Refused`, JavaScript's `IdgenRefusedError`.
    #[error("{message}")]
    Refused { reason: String, message: String, retry_after_ms: Option<u64> },
    /// A service refused the request for a reason of its own (its 4xx `code`): a public-ID
    /// type it does not know, a format the caller may not use. Python's `idgen.Rejected`.
    #[error("{message}")]
    Rejected { status: u16, code: String, message: String },
    /// Anything else: a configuration that cannot start, a handle already closed, a fleet that
    /// answered something unreadable.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid { code, message: message.into() }
    }

    /// The generator's refusal, with the wait the worker's `Retry-After` would give.
    pub(crate) fn refused(refusal: &Refusal) -> Self {
        let retry_after_ms = match refusal {
            Refusal::ClockBehind { behind_ms } => (*behind_ms).max(1) as u64,
            Refusal::RegionRetired { .. } => return Error::refusal(refusal.reason(), refusal.to_string(), None),
            _ => 1_000,
        };
        Error::refusal(refusal.reason(), format!("refusing to issue: {refusal}"), Some(retry_after_ms))
    }

    pub(crate) fn refusal(reason: &str, message: impl Into<String>, retry_after_ms: Option<u64>) -> Self {
        Error::Refused { reason: reason.to_owned(), message: message.into(), retry_after_ms }
    }

    pub(crate) fn forked() -> Self {
        Error::refusal(
            "forked",
            "this handle was started before the process forked: a forked child never issues under its parent's \
             lease; start a generator (or client) in the child",
            None,
        )
    }

    pub(crate) fn closed() -> Self {
        Error::Failed("this handle is closed".into())
    }
}

/// `call`, with a panic in it (a bug) answered as [`Error::Failed`]: a binding's entry points run
/// through this, since a panic unwinding into Node-API (or any C caller) aborts the host
/// process, whatever the caller's `try` would have done.
pub fn unwound<T>(call: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        let what = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
            (Some(text), _) => text.to_string(),
            (None, Some(text)) => text.clone(),
            (None, None) => "a panic without a message".to_owned(),
        };
        Err(Error::Failed(format!("a panic in idgen's native code (a bug; please report it): {what}")))
    })
}

impl From<idgen_client::Error> for Error {
    fn from(error: idgen_client::Error) -> Self {
        use idgen_client::Error as E;
        let message = error.to_string();
        match error {
            E::OverQuota { retry_after, .. } => {
                Error::refusal("over_quota", message, Some(retry_after.map_or(1_000, |d| d.as_millis() as u64)))
            }
            E::Unavailable { .. } => Error::refusal("unavailable", message, Some(1_000)),
            E::InvalidArgument(_) => Error::invalid("invalid_argument", message),
            E::Config(_) => Error::invalid("invalid_config", message),
            // The input was checked before (`decode::parse`): what is left is a schedule the
            // registry has not given yet.
            E::Decode { .. } => Error::refusal("schedule", message, Some(1_000)),
            E::Rejected { status, code, .. } => Error::Rejected { status, code, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic becomes the one error family's `Failed`, with what it said; an answer or an error
    /// passes through.
    #[test]
    fn a_panic_is_answered_as_failed() {
        let answered: Result<u32, Error> = unwound(|| panic!("the schedule had no layout"));
        let Err(Error::Failed(message)) = answered else { panic!("{answered:?}") };
        assert!(message.contains("the schedule had no layout"), "{message}");
        let formatted: Result<u32, Error> = unwound(|| panic!("layout {} missing", 2));
        assert!(matches!(formatted, Err(Error::Failed(message)) if message.contains("layout 2 missing")));
        assert_eq!(unwound(|| Ok::<_, Error>(7)), Ok(7));
        assert_eq!(unwound(|| Err::<u32, _>(Error::closed())), Err(Error::closed()));
    }
}
