//! [`Embedded`]: `idgen::EmbeddedGenerator` behind blocking calls, for a host language.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use idgen::core::text::IdText;
use idgen::{EmbeddedGenerator, GeneratorConfig, IdGenerator};
use prometheus_client::registry::Registry;

use crate::decode::{self, Decoded, IdInput};
use crate::runtime::{self, Held};
use crate::{Error, IdSource, check_count};

/// The default prefix of the environment variables that override the configuration file's
/// keys (`IDGEN_EMBEDDED_LEASE__STORE=dynamodb`), as `IDGEN_WORKER_` does for the worker: not
/// `IDGEN_` alone, which a host's other settings share.
pub const DEFAULT_ENV_PREFIX: &str = "IDGEN_EMBEDDED";

/// The embedded generator, started from a configuration file, held until [`Embedded::close`].
/// Calls from many threads at once are fine; `close` waits for the calls under way.
pub struct Embedded {
    held: Held,
    state: RwLock<Option<Running>>,
}

struct Running {
    embedded: EmbeddedGenerator,
    /// The request path, reached without the embedded generator's future for the common case.
    generator: Arc<IdGenerator>,
    metrics: Registry,
}

impl Embedded {
    /// Loads the generator's configuration (`config_path`, then the variables under
    /// `env_prefix`, [`DEFAULT_ENV_PREFIX`] if `None`; the keys a Rust embedder's or the worker's
    /// file has), starts it, and waits up to `ready_timeout`
    /// for its first lease; still refusing then, it is shut down and the refusal returned.
    /// `None` returns at once: calls are refused until the first claim.
    pub fn start(
        config_path: Option<&Path>,
        env_prefix: Option<&str>,
        ready_timeout: Option<Duration>,
    ) -> Result<Embedded, Error> {
        let config = GeneratorConfig::load(config_path, env_prefix.unwrap_or(DEFAULT_ENV_PREFIX))
            .map_err(|e| Error::invalid("invalid_config", format!("{e:#}")))?;
        let held = Held::new()?;
        let mut metrics = Registry::default();
        let embedded = held.block_on(EmbeddedGenerator::start(&config, &mut metrics))?.map_err(|e| {
            // A lease file this process's parent had open when it forked: the same refusal as a
            // handle carried across the fork, with what to do instead.
            match e.chain().find_map(|cause| cause.downcast_ref::<idgen::StoreError>()) {
                Some(idgen::StoreError::Forked(why)) => Error::refusal("forked", why.clone(), None),
                _ => Error::Failed(format!("starting the embedded generator: {e:#}")),
            }
        })?;
        if let Some(timeout) = ready_timeout
            && let Err(refusal) = held.block_on(embedded.ready(timeout))?
        {
            let _ = held.block_on(embedded.shutdown());
            return Err(Error::refused(&refusal));
        }
        let generator = embedded.generator().clone();
        Ok(Embedded { held, state: RwLock::new(Some(Running { embedded, generator, metrics })) })
    }

    fn running<T>(&self, call: impl FnOnce(&Running) -> Result<T, Error>) -> Result<T, Error> {
        let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let running = state.as_ref().ok_or_else(Error::closed)?;
        if !runtime::unforked(self.held.generation) {
            return Err(Error::forked());
        }
        call(running)
    }

    /// One ID from the current millisecond's run, without waiting or locking; `None` when
    /// there is none now ([`Embedded::next_id`] then waits for one, or says why not).
    #[inline]
    pub fn try_next_id(&self) -> Result<Option<u64>, Error> {
        self.running(|running| Ok(running.generator.try_next_id()))
    }

    /// Issuing (`Ok`), or the refusal a call would get now.
    pub fn health(&self) -> Result<(), Error> {
        self.running(|running| match running.embedded.health() {
            idgen::Health::Issuing { .. } => Ok(()),
            idgen::Health::Refusing { refusal, .. } => Err(Error::refused(&refusal)),
        })
    }

    /// This generator's region, its number, and the name in its lease rows.
    pub fn identity(&self) -> Result<(String, u32, String), Error> {
        self.running(|running| {
            let e = &running.embedded;
            Ok((e.region().to_owned(), e.region_number(), e.holder().to_owned()))
        })
    }

    /// The generator's metrics in the Prometheus text format (the names a worker exports), to
    /// serve or append to the host's own.
    pub fn metrics_text(&self) -> Result<String, Error> {
        self.running(|running| {
            running.embedded.refresh_metrics();
            crate::encode_metrics(&running.metrics)
        })
    }

    /// Stops issuing and releases the leases. Later calls fail; closing twice is a no-op. In a
    /// forked child nothing is released (the leases are the parent's).
    pub fn close(&self) -> Result<(), Error> {
        if !runtime::unforked(self.held.generation) {
            return Ok(());
        }
        let running = self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        match running {
            Some(running) => self
                .held
                .block_on(running.embedded.shutdown())?
                .map_err(|e| Error::Failed(format!("releasing the leases: {e:#}"))),
            None => Ok(()),
        }
    }
}

impl IdSource for Embedded {
    fn next_id(&self) -> Result<u64, Error> {
        self.running(|running| match running.generator.try_next_id() {
            Some(id) => Ok(id),
            None => self.held.block_on(running.embedded.next_id())?.map_err(|refusal| Error::refused(&refusal)),
        })
    }

    fn next_ids(&self, count: u64) -> Result<Vec<u64>, Error> {
        let count = check_count(count)?;
        self.running(|running| {
            self.held.block_on(running.embedded.next_ids(count))?.map_err(|refusal| Error::refused(&refusal))
        })
    }

    fn next_uuids(&self, count: u64) -> Result<Vec<[u8; 16]>, Error> {
        let count = check_count(count)?;
        self.running(|running| {
            self.held.block_on(running.embedded.next_uuids(count))?.map_err(|refusal| Error::refused(&refusal))
        })
    }

    fn decode(&self, id: IdInput<'_>) -> Result<Decoded, Error> {
        let text = decode::parse(id)?;
        self.running(|running| match text {
            IdText::Uuid(bytes) => Ok(decode::uuid_decoded(bytes)),
            IdText::Snowflake(value) => {
                let fields =
                    running.embedded.decode(value).map_err(|e| Error::invalid("out_of_range", e.to_string()))?;
                let names = running.embedded.region_names().read().unwrap_or_else(|p| p.into_inner());
                Ok(decode::snowflake_decoded(&fields, &names))
            }
        })
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if !runtime::unforked(self.held.generation) {
            // The parent's generator, copied by fork: its threads are not here to stop.
            let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
            std::mem::forget(state);
        }
    }
}
