//! [`PublicIds`]: the public-ID service's three calls (create, resolve, look up) behind blocking
//! calls, with the fleet client's connection settings (`url`, `request_timeout_ms`,
//! `connect_timeout_ms`, `tls`). The service decides everything; this only speaks its API.

use idgen::control::tls::ClientTlsSection;
use idgen_client::ErrorBody;
use serde::Deserialize;
use std::path::Path;

use crate::Error;
use crate::decode::{self, IdInput};
use crate::runtime::Held;

/// The settings, the fleet client's keys that apply to one endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublicIdsConfig {
    pub url: String,
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub tls: ClientTlsSection,
}

impl Default for PublicIdsConfig {
    fn default() -> Self {
        PublicIdsConfig {
            url: String::new(),
            request_timeout_ms: 1_000,
            connect_timeout_ms: 300,
            tls: ClientTlsSection::default(),
        }
    }
}

/// One mapping, as the service answers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Mapping {
    pub public_id: String,
    #[serde(deserialize_with = "decimal")]
    pub internal_id: u64,
    /// Given by a create and a lookup; a resolve answers the two IDs (and the type) only.
    pub format: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

fn decimal<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(serde::de::Error::custom)
}

pub struct PublicIds {
    held: Held,
    /// `None` once closed: its pooled connections are let go, and every call is refused.
    http: std::sync::RwLock<Option<reqwest::Client>>,
    url: String,
}

impl PublicIds {
    /// From its settings, as exactly one of: a JSON object (a binding's keyword arguments), or
    /// a TOML file of the same keys. An unknown key is refused.
    pub fn from_settings(json: Option<&str>, file: Option<&Path>) -> Result<PublicIds, Error> {
        PublicIds::new(crate::settings("public-ID client configuration", json, file)?)
    }

    fn new(config: PublicIdsConfig) -> Result<PublicIds, Error> {
        idgen_client::check_endpoint(&config.url)?;
        if config.request_timeout_ms == 0 || config.connect_timeout_ms == 0 {
            return Err(Error::invalid("invalid_config", "request_timeout_ms and connect_timeout_ms above 0"));
        }
        let http = idgen_client::http_builder(config.request_timeout_ms, config.connect_timeout_ms, &config.tls)?
            .build()
            .map_err(|e| Error::Failed(format!("the HTTP client: {e}")))?;
        Ok(PublicIds {
            held: Held::new()?,
            http: std::sync::RwLock::new(Some(http)),
            url: config.url.trim_end_matches('/').to_owned(),
        })
    }

    /// Lets go of the pooled connections; every call after it is refused (`closed`). Closing
    /// twice is the same as once.
    pub fn close(&self) {
        self.http.write().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    }

    /// The HTTP client (a handle on the shared one), unless closed.
    fn http(&self) -> Result<reqwest::Client, Error> {
        self.http.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone().ok_or_else(Error::closed)
    }

    /// The public ID of `internal_id` in `format` (the service's default if `None`), of `kind`
    /// (a configured type) if given: made now, or the one it already has. Returns whether it
    /// was made now.
    pub fn create(
        &self,
        internal_id: IdInput<'_>,
        format: Option<&str>,
        kind: Option<&str>,
    ) -> Result<(Mapping, bool), Error> {
        let id = internal(internal_id)?;
        let mut body = serde_json::json!({ "internal_id": id.to_string() });
        if let Some(format) = format {
            body["format"] = format.into();
        }
        if let Some(kind) = kind {
            body["type"] = kind.into();
        }
        let request = self.http()?.post(format!("{}/v1/public-ids", self.url)).json(&body);
        match self.call(request)? {
            Some((status, mapping)) => Ok((mapping, status == 201)),
            None => Err(Error::Failed("the service answered 404 to a create".into())),
        }
    }

    /// The mapping of `public_id`, or `None` (unknown and forged look the same).
    pub fn resolve(&self, public_id: &str) -> Result<Option<Mapping>, Error> {
        let mut url =
            reqwest::Url::parse(&format!("{}/v1/public-ids/", self.url)).map_err(|e| Error::Failed(e.to_string()))?;
        url.path_segments_mut()
            .map_err(|_| Error::Failed("the service URL cannot take a path".into()))?
            .pop_if_empty()
            .push(public_id);
        Ok(self.call(self.http()?.get(url))?.map(|(_, mapping)| mapping))
    }

    /// The public ID `internal_id` has in `format` (of `kind`), or `None`.
    pub fn lookup(
        &self,
        internal_id: IdInput<'_>,
        format: Option<&str>,
        kind: Option<&str>,
    ) -> Result<Option<Mapping>, Error> {
        let id = internal(internal_id)?;
        let mut query = Vec::new();
        if let Some(format) = format {
            query.push(("format", format));
        }
        if let Some(kind) = kind {
            query.push(("type", kind));
        }
        let request = self.http()?.get(format!("{}/v1/internal-ids/{id}/public-id", self.url)).query(&query);
        Ok(self.call(request)?.map(|(_, mapping)| mapping))
    }

    /// Sends `request`; `None` for a 404.
    fn call(&self, request: reqwest::RequestBuilder) -> Result<Option<(u16, Mapping)>, Error> {
        // `block_on` refuses in a forked child.
        self.held.block_on(async move {
            let response = request
                .send()
                .await
                .map_err(|e| Error::refusal("unavailable", format!("the public-ID service: {e}"), Some(1_000)))?;
            let status = response.status().as_u16();
            if response.status().is_success() {
                let mapping = response.json().await.map_err(|e| Error::Failed(format!("an unreadable answer: {e}")))?;
                return Ok(Some((status, mapping)));
            }
            if status == 404 {
                return Ok(None);
            }
            let retry_after_ms = idgen_client::retry_after(response.headers()).map(|wait| wait.as_millis() as u64);
            let body: ErrorBody = response.json().await.unwrap_or_default();
            let message = format!("{status} {}: {}", body.error.code, body.error.message);
            Err(match status {
                429 => Error::refusal("over_quota", message, retry_after_ms.or(Some(1_000))),
                500..=599 => Error::refusal("unavailable", message, retry_after_ms.or(Some(1_000))),
                _ => Error::Rejected { status, code: body.error.code, message },
            })
        })?
    }
}

fn internal(id: IdInput<'_>) -> Result<u64, Error> {
    match decode::parse(id)? {
        idgen::core::text::IdText::Snowflake(id) => Ok(id),
        idgen::core::text::IdText::Uuid(_) => {
            Err(Error::invalid("not_an_id", "an internal ID is a 63-bit ID, not a UUID"))
        }
    }
}
