//! The one seam between idgen's Rust crates and every other language.
//!
//! What it owns: handles on the embedded generator ([`Embedded`]), the fleet client
//! ([`Client`]) and the public-ID service ([`PublicIds`]) whose calls block the calling thread (a binding releases its interpreter's lock
//! around them), decode by a schedule ([`decode`]), one error type whose variants a binding maps
//! to its language's exceptions ([`Error`]), and the process's runtime ([`runtime`]): the tokio
//! threads every handle runs on, started on first use, and the fork guard.
//!
//! What it must never do: hold a rule of its own. Leases, the fence, the clock gate, prefetch,
//! failover and the layouts are the crates' below (`idgen`, `idgen-client`, `idgen-core`); this
//! crate only calls them. Nor does it know a language: the Python and Node bindings
//! (`sdk/python`, `sdk/node`) wrap it, and its types are plain (integers, strings, byte arrays),
//! so a C ABI could serve the same functions.
//!
//! Forks: a child forked from a process that runs a generator has a copy of its lease state but
//! none of its threads (the lease keeper, the clock ticker). Issuing there would repeat the
//! parent's IDs, so a handle started before a fork refuses every call in the child
//! ([`Error::Refused`] with reason `forked`); the child starts its own, which claims its own
//! machine number.

mod client;
mod decode;
mod embedded;
mod error;
mod public_ids;
pub mod runtime;

/// TypeID text (public IDs): the core's parser and encoder.
pub mod typeid {
    pub use idgen::core::typeid::{is_type_prefix, parse_typeid, typeid_text};
}

pub use client::Client;
pub use decode::{Decoded, IdInput, LayoutFrom, decode, default_schedule};
pub use embedded::{DEFAULT_ENV_PREFIX, Embedded};
pub use error::{Error, unwound};
pub use public_ids::{Mapping, PublicIds, PublicIdsConfig};

/// The calls both handles that hand out IDs answer, the embedded generator ([`Embedded`]) and
/// the fleet client ([`Client`]): one shape, so a binding writes each call once.
pub trait IdSource: Send + Sync {
    /// One ID, above every ID this source handed out before (while it uses one endpoint).
    fn next_id(&self) -> Result<u64, Error>;
    /// `count` (1 to [`MAX_COUNT`]) increasing IDs.
    fn next_ids(&self, count: u64) -> Result<Vec<u64>, Error>;
    /// `count` (1 to [`MAX_COUNT`]) increasing UUIDv7s.
    fn next_uuids(&self, count: u64) -> Result<Vec<[u8; 16]>, Error>;
    /// `id` taken apart by the schedule in force (the registry's), regions named.
    fn decode(&self, id: IdInput<'_>) -> Result<Decoded, Error>;
}

/// The most IDs one `next_ids` or `next_uuids` call returns.
pub const MAX_COUNT: u64 = 100_000;

fn check_count(count: u64) -> Result<u32, Error> {
    match count {
        1..=MAX_COUNT => Ok(count as u32),
        _ => Err(Error::invalid("invalid_count", format!("count must be 1 to {MAX_COUNT}, not {count}"))),
    }
}

/// A handle's settings from exactly one of: a JSON object of its keys (a binding's keyword
/// arguments or options object), or a TOML file of them.
fn settings<T: serde::de::DeserializeOwned>(
    what: &str,
    json: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<T, Error> {
    match (json, file) {
        (Some(json), None) => settings_from_json(what, json),
        (None, Some(file)) => settings_from_file(file),
        _ => Err(Error::invalid("invalid_config", "give the settings or a configuration file, not both")),
    }
}

/// A handle's settings from a JSON object of its keys; an unknown key is refused by name.
fn settings_from_json<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, Error> {
    serde_json::from_str(json).map_err(|e| Error::invalid("invalid_config", format!("{what}: {e}")))
}

/// A handle's settings from a TOML file of the same keys.
fn settings_from_file<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid("invalid_config", format!("reading {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| Error::invalid("invalid_config", format!("{}: {e}", path.display())))
}

fn encode_metrics(registry: &prometheus_client::registry::Registry) -> Result<String, Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .map_err(|e| Error::Failed(format!("encoding the metrics: {e}")))?;
    Ok(text)
}
