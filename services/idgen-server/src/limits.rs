//! `[limits]`: what one peer may hold of a listener. Every idgen listener (the worker, the
//! registry, the public-ID service, and each one's plain health listener) reads the same section
//! and enforces it in [`crate::serve()`]: a cap on open connections, and a deadline on every wait
//! for a peer (its TLS handshake, a request's headers, its body, the quiet time between two
//! requests). Without them a peer inside the network holds sockets for as long as it likes, up
//! to the process's file limit, and the service stops accepting anyone.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// The longest any deadline may be set to: an hour. Larger values are typos (extra zeros), and
/// a wait that long bounds nothing.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The largest cap: a million connections is past what one process's memory holds; a larger
/// value is a typo that would make the cap no cap.
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// The bounds of `max_header_bytes`: hyper's smallest read buffer (8 KiB), and 1 MiB, past which
/// a cap times the connection cap no longer fits a host's memory.
pub const HEADER_BYTES: std::ops::RangeInclusive<usize> = 8_192..=1_048_576;

/// `[limits]`: a cap on connections and a deadline on each wait for a peer, per listener.
/// Every key has a production default; none can be switched off.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Connections open at once on one listener (the health listener has its own count). A
    /// connection over the cap is accepted and closed at once, and counted
    /// (`idgen_connections_refused_total`). Default 4096: each connection costs a file
    /// descriptor and, idle, a few tens of KiB (read buffer, TLS state), so the cap keeps a flood
    /// within memory and under the unit's `LimitNOFILE` (sized above twice the cap: the service
    /// and health listeners, plus the database pool and files), while leaving room for every
    /// worker of a region keeping a connection to the registry.
    pub max_connections: usize,
    /// From accept to a finished TLS handshake (ms). Default 5000: inside one network a handshake
    /// is a few round trips of well under a millisecond each; the rest is room for a paused peer.
    pub handshake_timeout_ms: u64,
    /// From a request's first byte to the end of its headers (ms). Default 5000: a request's
    /// headers fit in one segment; a peer trickling them is holding the socket, not sending.
    pub header_read_timeout_ms: u64,
    /// From the end of a request's headers to the end of its body (ms). Default 10000: every
    /// request body idgen takes is a small JSON document.
    pub body_read_timeout_ms: u64,
    /// How long a connection may wait for the first byte of a request: after it opens (after the
    /// handshake), and between a response and the next request of a kept-alive connection
    /// (ms). Default 75000: longer than the idle time after which idgen's own client closes a
    /// pooled connection (60 s), so that the client closes first and never sends a request on a
    /// connection the server is closing at that moment.
    pub idle_timeout_ms: u64,
    /// The most a request's line and headers may take of a connection's read buffer (bytes): past
    /// it the request is answered 431 and the connection closed, and counted
    /// (`idgen_requests_too_large_total`). Default 16384: idgen's callers send a few hundred
    /// bytes of headers (a browser on the console, with its cookies, a few KiB), and hyper's own
    /// default (about 400 KB) times `max_connections` is more memory than a host has.
    pub max_header_bytes: usize,
    /// TLS handshakes under way at once on one listener (and never more than `max_connections`). A
    /// connection holds one of these, not a connection slot, until its handshake is done, so
    /// handshakes left unfinished never take the slots of connections that finished theirs; one
    /// over the cap is accepted and closed at once, and counted
    /// (`idgen_tls_handshakes_refused_total`). Default 1024.
    pub max_handshakes: usize,
    /// TLS handshakes under way at once from one source address: a single host opening
    /// handshakes it never finishes cannot take every handshake slot from the others. Default 32.
    pub max_handshakes_per_source: usize,
    /// How long a connection may live (ms): once idle past it (less a random tenth, so that
    /// connections made together do not close together) it is closed, and counted
    /// (`idgen_connections_timed_out_total{deadline="max_age"}`); the client opens another, with
    /// a handshake that checks its certificate against the CRLs in force. A connection never idle
    /// (pipelined requests) is closed past it plus the header and body deadlines, whatever it is
    /// doing. Default 3,600,000 (an hour).
    pub max_connection_age_ms: u64,
}

/// The bounds of `max_connection_age_ms`: a second, and a day.
pub const CONNECTION_AGE_MS: std::ops::RangeInclusive<u64> = 1_000..=86_400_000;

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_connections: 4096,
            handshake_timeout_ms: 5_000,
            header_read_timeout_ms: 5_000,
            body_read_timeout_ms: 10_000,
            idle_timeout_ms: 75_000,
            max_header_bytes: 16_384,
            max_handshakes: 1_024,
            max_handshakes_per_source: 32,
            max_connection_age_ms: 3_600_000,
        }
    }
}

impl LimitsSection {
    pub fn validate(&self) -> anyhow::Result<()> {
        for (key, cap) in [
            ("max_connections", self.max_connections),
            ("max_handshakes", self.max_handshakes),
            ("max_handshakes_per_source", self.max_handshakes_per_source),
        ] {
            if !(1..=MAX_CONNECTIONS).contains(&cap) {
                bail!(
                    "limits.{key} must be from 1 to {MAX_CONNECTIONS}, not {cap} (a listener taking none serves nothing)"
                );
            }
        }
        if !CONNECTION_AGE_MS.contains(&self.max_connection_age_ms) {
            bail!(
                "limits.max_connection_age_ms must be from {} to {} (ms), not {}",
                CONNECTION_AGE_MS.start(),
                CONNECTION_AGE_MS.end(),
                self.max_connection_age_ms
            );
        }
        if !HEADER_BYTES.contains(&self.max_header_bytes) {
            bail!(
                "limits.max_header_bytes must be from {} to {}, not {}",
                HEADER_BYTES.start(),
                HEADER_BYTES.end(),
                self.max_header_bytes
            );
        }
        for (key, ms) in self.timeouts() {
            if !(1..=MAX_TIMEOUT_MS).contains(&ms) {
                bail!("limits.{key} must be from 1 to {MAX_TIMEOUT_MS} (ms), not {ms}");
            }
        }
        Ok(())
    }

    fn timeouts(&self) -> [(&'static str, u64); 4] {
        [
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ]
    }

    /// Handshakes under way at once: `max_handshakes`, within `max_connections`.
    pub fn handshakes(&self) -> usize {
        self.max_handshakes.min(self.max_connections)
    }

    /// Handshakes under way at once from one address, within [`Self::handshakes`].
    pub fn handshakes_per_source(&self) -> usize {
        self.max_handshakes_per_source.min(self.handshakes())
    }

    pub fn max_connection_age(&self) -> Duration {
        Duration::from_millis(self.max_connection_age_ms)
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    /// The `--check-config` line: what every listener of the service enforces.
    pub fn describe(&self) -> String {
        format!(
            "limits: at most {} connections per listener ({} TLS handshakes under way, {} from one address), {} bytes \
             of headers a request; deadlines: TLS handshake {} ms, headers {} ms, body {} ms, idle {} ms",
            self.max_connections,
            self.handshakes(),
            self.handshakes_per_source(),
            self.max_header_bytes,
            self.handshake_timeout_ms,
            self.header_read_timeout_ms,
            self.body_read_timeout_ms,
            self.idle_timeout_ms
        )
    }
}

/// `health_listen` beside `listen`: a port of its own (port 0, as tests use, picks one each).
pub fn validate_health_listen(listen: SocketAddr, health_listen: Option<SocketAddr>) -> anyhow::Result<()> {
    match health_listen {
        Some(health)
            if health.port() != 0
                && health.port() == listen.port()
                && (health.ip() == listen.ip() || health.ip().is_unspecified() || listen.ip().is_unspecified()) =>
        {
            bail!("health_listen {health} takes listen's port ({listen}): the health listener needs a port of its own")
        }
        _ => Ok(()),
    }
}

/// The `--check-config` line of the health listener.
pub fn describe_health_listen(health_listen: Option<SocketAddr>) -> String {
    match health_listen {
        Some(address) => format!("health listener: plain HTTP on {address}, GET /healthz only, the same [limits]"),
        None => "health listener: none (health_listen unset)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_nothing_can_be_switched_off() {
        LimitsSection::default().validate().unwrap();
        let zero_cap = LimitsSection { max_connections: 0, ..Default::default() };
        assert!(format!("{:#}", zero_cap.validate().unwrap_err()).contains("max_connections"));
        let zero = LimitsSection { max_handshakes: 0, ..Default::default() };
        assert!(format!("{:#}", zero.validate().unwrap_err()).contains("max_handshakes"));
        let source = LimitsSection { max_handshakes_per_source: 0, ..Default::default() };
        assert!(format!("{:#}", source.validate().unwrap_err()).contains("max_handshakes_per_source"));
        let small = LimitsSection { max_connections: 10, ..Default::default() };
        assert_eq!((small.handshakes(), small.handshakes_per_source()), (10, 10));
        for bytes in [0, 8_191, 1_048_577] {
            let limits = LimitsSection { max_header_bytes: bytes, ..Default::default() };
            assert!(format!("{:#}", limits.validate().unwrap_err()).contains("max_header_bytes"), "{bytes}");
        }
        for key in ["handshake_timeout_ms", "header_read_timeout_ms", "body_read_timeout_ms", "idle_timeout_ms"] {
            for ms in [0, MAX_TIMEOUT_MS + 1] {
                let mut limits = LimitsSection::default();
                match key {
                    "handshake_timeout_ms" => limits.handshake_timeout_ms = ms,
                    "header_read_timeout_ms" => limits.header_read_timeout_ms = ms,
                    "body_read_timeout_ms" => limits.body_read_timeout_ms = ms,
                    _ => limits.idle_timeout_ms = ms,
                }
                let error = format!("{:#}", limits.validate().unwrap_err());
                assert!(error.contains(key), "{key} = {ms}: {error}");
            }
        }
    }

    #[test]
    fn a_section_names_only_known_keys() {
        let parsed: LimitsSection = serde_json::from_str(r#"{"max_connections": 10}"#).unwrap();
        assert_eq!(parsed, LimitsSection { max_connections: 10, ..Default::default() });
        let unknown = serde_json::from_str::<LimitsSection>(r#"{"max_connection": 10}"#).unwrap_err();
        assert!(unknown.to_string().contains("max_connection"), "{unknown}");
    }
}
