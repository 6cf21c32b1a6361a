//! [`Client`]: `idgen_client::Client` (prefetch, failover and failback, local decode) behind
//! blocking calls, configured by the Rust client's own keys.

use std::path::Path;
use std::sync::RwLock;

use idgen::core::text::IdText;
use idgen_client::ClientConfig;
use prometheus_client::registry::Registry;

use crate::decode::{self, Decoded, IdInput};
use crate::runtime::{self, Held};
use crate::{Error, IdSource, check_count};

pub struct Client {
    held: Held,
    client: RwLock<Option<idgen_client::Client>>,
    metrics: Registry,
}

impl Client {
    /// A client from the Rust client's configuration keys (`url`, `backups`,
    /// `prefetch = {batch, low_water, validity_ms}`, `tls`, …), given as exactly one of: a JSON
    /// object (a binding's keyword arguments or options object), or a TOML file. An unknown key
    /// is refused.
    pub fn from_settings(json: Option<&str>, file: Option<&Path>) -> Result<Client, Error> {
        Client::start(crate::settings("client configuration", json, file)?)
    }

    fn start(config: ClientConfig) -> Result<Client, Error> {
        let held = Held::new()?;
        let mut metrics = Registry::default();
        let client = held.block_on(idgen_client::Client::builder(config).metrics(&mut metrics).build())??;
        Ok(Client { held, client: RwLock::new(Some(client)), metrics })
    }

    fn with<T>(&self, call: impl FnOnce(&idgen_client::Client) -> Result<T, Error>) -> Result<T, Error> {
        let client = self.client.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let client = client.as_ref().ok_or_else(Error::closed)?;
        if !runtime::unforked(self.held.generation) {
            return Err(Error::forked());
        }
        call(client)
    }

    /// One ID from the prefetched buffer if it holds a valid one, else `None`: never waits.
    pub fn try_next_id(&self) -> Result<Option<u64>, Error> {
        self.with(|client| {
            let _in_runtime = self.held.runtime().enter();
            Ok(client.try_next_id())
        })
    }

    /// The endpoint requests go to now (the local fleet, or a backup after a failover).
    pub fn endpoint(&self) -> Result<String, Error> {
        self.with(|client| Ok(client.endpoint().to_owned()))
    }

    /// The client's metrics (requests by endpoint and outcome, moves, the buffer) as Prometheus
    /// text.
    pub fn metrics_text(&self) -> Result<String, Error> {
        self.with(|_| crate::encode_metrics(&self.metrics))
    }

    /// Drops the connections and the buffer; later calls fail.
    pub fn close(&self) {
        let client = self.client.write().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if !runtime::unforked(self.held.generation) {
            std::mem::forget(client);
        }
    }
}

impl IdSource for Client {
    /// From the prefetched buffer while it holds a valid one.
    fn next_id(&self) -> Result<u64, Error> {
        self.with(|client| Ok(self.held.block_on(client.next_id())??))
    }

    fn next_ids(&self, count: u64) -> Result<Vec<u64>, Error> {
        let count = check_count(count)?;
        self.with(|client| Ok(self.held.block_on(client.next_ids(count))??))
    }

    fn next_uuids(&self, count: u64) -> Result<Vec<[u8; 16]>, Error> {
        let count = check_count(count)?;
        self.with(|client| {
            let uuids = self.held.block_on(client.next_uuids(count))??;
            Ok(uuids.into_iter().map(|uuid| uuid.into_bytes()).collect())
        })
    }

    /// Locally, by the registry's schedule and region names.
    fn decode(&self, id: IdInput<'_>) -> Result<Decoded, Error> {
        let text = decode::parse(id)?;
        self.with(|client| match text {
            IdText::Uuid(bytes) => Ok(decode::uuid_decoded(bytes)),
            IdText::Snowflake(value) => {
                let d = client.decode(value)?;
                Ok(Decoded {
                    id: value.to_string(),
                    value: Some(value),
                    uuid: None,
                    layout: d.layout,
                    created_at_unix_ms: d.created_at_unix_ms,
                    created_at: idgen::core::format_unix_ms(d.created_at_unix_ms),
                    region_number: d.region_number,
                    region: d.region,
                    machine: Some(d.machine),
                    sequence: Some(d.sequence),
                })
            }
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !runtime::unforked(self.held.generation) {
            let client = self.client.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
            std::mem::forget(client);
        }
    }
}
