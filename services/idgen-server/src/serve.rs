//! The accept loop every idgen listener runs: plain HTTP (development, every caller `anonymous`)
//! or TLS, with the caller's identity taken once at the handshake and handed to the service made
//! for that connection; HTTP/1.1 with keep-alive; the `[limits]` of every listener (a cap on open
//! connections, over which a connection is accepted and closed at once; a cap of their own on TLS
//! handshakes under way, in all and from one address, so that an unfinished handshake never holds
//! a connection's slot; a handshake deadline;
//! the deadlines of `connection`); and a graceful shutdown that stops accepting, lets in-flight
//! requests finish within a grace period, then returns.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use crate::connection::{Activity, ActivityIo, Guarded};
use crate::{Caller, LimitsSection, Tls};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Which listener of the process: the service's own port, or its plain health port.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadlineLabel {
    listener: &'static str,
    deadline: &'static str,
}

/// The listeners a process runs: `service` (its port, plain or TLS) and `health` (the plain
/// health port the load balancer checks).
const LISTENERS: [&str; 2] = ["service", "health"];

/// Every deadline a connection is closed by (`[limits]`).
const DEADLINES: [&str; 7] =
    ["handshake", "idle", "header_read", "body_read", "max_age", "certificate_expired", "revoked"];

/// TLS handshakes completed, and refused by reason; connections open, refused over the cap, and
/// closed by a deadline, per listener.
#[derive(Default)]
pub struct ServerMetrics {
    handshakes: Counter,
    handshake_failures: Family<ReasonLabel, Counter>,
    connections_open: Family<ListenerLabel, Gauge>,
    connections_refused: Family<ListenerLabel, Counter>,
    connections_timed_out: Family<DeadlineLabel, Counter>,
    requests_too_large: Family<ListenerLabel, Counter>,
    handshakes_refused: Family<ListenerLabel, Counter>,
    crl_next_update: Family<crate::tls::IssuerLabel, Gauge>,
}

/// Every reason a handshake is counted under, so each series exists at 0 from the start.
const HANDSHAKE_FAILURES: [&str; 15] = [
    "no_client_certificate",
    "certificate_expired",
    "certificate_not_yet_valid",
    "unknown_issuer",
    "certificate_revoked",
    "revocation_status_unknown",
    "invalid_certificate",
    "alert_from_client",
    "incompatible",
    "tls_error",
    "io",
    "timeout",
    "certificate_names_nobody",
    "certificate_names_several",
    "reserved_identity",
];

impl ServerMetrics {
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        for reason in HANDSHAKE_FAILURES {
            let _ = self.handshake_failures.get_or_create(&ReasonLabel { reason });
        }
        registry.register("idgen_tls_handshakes", "TLS handshakes completed", self.handshakes.clone());
        registry.register(
            "idgen_tls_handshake_failures",
            "TLS handshakes refused or failed, by reason",
            self.handshake_failures.clone(),
        );
        for listener in LISTENERS {
            let _ = self.connections_open.get_or_create(&ListenerLabel { listener });
            let _ = self.connections_refused.get_or_create(&ListenerLabel { listener });
            let _ = self.requests_too_large.get_or_create(&ListenerLabel { listener });
            let _ = self.handshakes_refused.get_or_create(&ListenerLabel { listener });
            for deadline in DEADLINES {
                let _ = self.connections_timed_out.get_or_create(&DeadlineLabel { listener, deadline });
            }
        }
        registry.register(
            "idgen_connections_open",
            "Connections open (limits.max_connections per listener), by listener",
            self.connections_open.clone(),
        );
        registry.register(
            "idgen_connections_refused",
            "Connections closed at once because the listener had limits.max_connections open, by listener",
            self.connections_refused.clone(),
        );
        registry.register(
            "idgen_connections_timed_out",
            "Connections closed because the peer let a deadline of [limits] pass, or the connection's time was up (max_age; \
             certificate_expired; revoked: a reload no longer accepts its certificate), by listener and deadline",
            self.connections_timed_out.clone(),
        );
        registry.register(
            "idgen_tls_handshakes_refused",
            "Connections closed at once because limits.max_handshakes (or max_handshakes_per_source from their address) were under way, by listener",
            self.handshakes_refused.clone(),
        );
        registry.register(
            "idgen_tls_crl_next_update_seconds",
            "When each CRL of tls.crl says its next one is due (nextUpdate, Unix seconds), by issuer: past it the \
             CRL is stale (still applied); IdgenTlsCrlStale opens a ticket a day before",
            self.crl_next_update.clone(),
        );
        registry.register(
            "idgen_requests_too_large",
            "Requests answered 431 (and their connections closed) because their headers passed limits.max_header_bytes, by listener",
            self.requests_too_large.clone(),
        );
    }

    fn timed_out(&self, listener: &'static str, deadline: &'static str) {
        debug_assert!(DEADLINES.contains(&deadline), "deadline {deadline} is not in DEADLINES");
        self.connections_timed_out.get_or_create(&DeadlineLabel { listener, deadline }).inc();
    }

    fn failed(&self, reason: &'static str) {
        debug_assert!(HANDSHAKE_FAILURES.contains(&reason), "handshake failure {reason} is not in HANDSHAKE_FAILURES");
        self.handshake_failures.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// Why a handshake failed, in a few stable words.
fn reason(error: &std::io::Error) -> &'static str {
    use rustls::{CertificateError, Error};
    match error.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) {
        Some(Error::NoCertificatesPresented) => "no_client_certificate",
        Some(Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. })) => {
            "certificate_expired"
        }
        Some(Error::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        )) => "certificate_not_yet_valid",
        Some(Error::InvalidCertificate(CertificateError::UnknownIssuer)) => "unknown_issuer",
        Some(Error::InvalidCertificate(CertificateError::Revoked)) => "certificate_revoked",
        Some(Error::InvalidCertificate(CertificateError::UnknownRevocationStatus)) => "revocation_status_unknown",
        Some(Error::InvalidCertificate(_)) => "invalid_certificate",
        Some(Error::AlertReceived(_)) => "alert_from_client",
        Some(Error::PeerIncompatible(_) | Error::NoApplicationProtocol) => "incompatible",
        Some(_) => "tls_error",
        None => "io",
    }
}

/// Serves connections from `listener` until `shutdown` resolves, then stops accepting and waits up
/// to `grace` for open connections to finish their requests. `make_service` builds the service of
/// one connection from its caller. `limits` bounds what peers may hold (see the module).
pub async fn serve<M, S>(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    make_service: M,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
    metrics: Arc<ServerMetrics>,
    limits: LimitsSection,
) -> anyhow::Result<()>
where
    M: Fn(Caller) -> S + Clone + Send + 'static,
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    if let Some(tls) = &tls {
        tls.export_crls_to(&metrics.crl_next_update);
    }
    let listening = Listening { name: "service", limits, metrics };
    accept_loop(listening, listener, tls, make_service, shutdown, grace).await
}

/// A service's plain health listener (`health_listen`): no TLS, so that a load balancer, which
/// cannot present a client certificate, can check it; `service` routes `GET /healthz` and
/// answers everything else 404. Same `limits` as the service's port, with a cap of its own, so
/// that neither port's peers can use up the other's.
pub async fn serve_health<S>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
    metrics: Arc<ServerMetrics>,
    limits: LimitsSection,
) -> anyhow::Result<()>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let listening = Listening { name: "health", limits, metrics };
    accept_loop(listening, listener, None, move |_| service.clone(), shutdown, grace).await
}

/// `shutdown` split for a service's two listeners: the first future resolves when `shutdown`
/// does, the second once the first has (so the first must be polled: it is the service port's).
/// The health port stops accepting at the moment the service port does.
pub fn shared_shutdown(
    shutdown: impl Future<Output = ()> + Send,
) -> (impl Future<Output = ()> + Send, impl Future<Output = ()> + Send + 'static) {
    let (stop, mut stopped) = tokio::sync::watch::channel(());
    let first = async move {
        shutdown.await;
        drop(stop);
    };
    // Nothing is ever sent: `changed` returns when the sender is dropped.
    let second = async move {
        let _ = stopped.changed().await;
    };
    (first, second)
}

/// Binds `health_listen`, if set.
pub async fn bind_health(health_listen: Option<std::net::SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    use anyhow::Context;
    match health_listen {
        Some(address) => {
            Ok(Some(TcpListener::bind(address).await.with_context(|| format!("binding health_listen {address}"))?))
        }
        None => Ok(None),
    }
}

/// What a service's start-up line adds for its health listener: ` health=http://<address>`, or
/// nothing.
pub fn health_suffix(health: Option<&TcpListener>) -> std::io::Result<String> {
    Ok(match health {
        Some(health) => format!(" health=http://{}", health.local_addr()?),
        None => String::new(),
    })
}

/// One listener's name (the `listener` label), limits and metrics.
#[derive(Clone)]
struct Listening {
    name: &'static str,
    limits: LimitsSection,
    metrics: Arc<ServerMetrics>,
}

/// A connection counted among the open ones: its permit under the cap, and the gauge, both given
/// back when it closes.
struct Open {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A connection's client certificate, as its handshake verified it.
struct Certified {
    tls: Arc<Tls>,
    /// The configuration the handshake ran with: a reload during the handshake is checked again.
    handshake: Arc<crate::tls::Listener>,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    caller: Caller,
}

/// When a certificate's `notAfter` passes, on the runtime's clock (at most ten years ahead).
fn not_after(leaf: &rustls::pki_types::CertificateDer<'_>) -> Option<tokio::time::Instant> {
    use x509_cert::der::Decode;
    let certificate = x509_cert::Certificate::from_der(leaf).ok()?;
    let at = std::time::UNIX_EPOCH + certificate.tbs_certificate.validity.not_after.to_unix_duration();
    let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    Some(tokio::time::Instant::now() + left.min(Duration::from_secs(10 * 365 * 86_400)))
}

/// A connection slot under the cap, counted open; `None` (counted refused) over it.
fn take_slot(capacity: &Arc<Semaphore>, open: &Gauge, refused: &Counter) -> Option<Open> {
    let Ok(permit) = capacity.clone().try_acquire_owned() else {
        refused.inc();
        return None;
    };
    open.inc();
    Some(Open { _permit: permit, gauge: open.clone() })
}

/// The TLS handshakes under way on one listener: in all, and by source address.
struct Handshakes {
    all: Arc<Semaphore>,
    per_source: usize,
    by_source: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One handshake under way: given back when it ends, however it ends.
struct Handshaking {
    _slot: OwnedSemaphorePermit,
    source: std::net::IpAddr,
    handshakes: Arc<Handshakes>,
}

impl Handshakes {
    fn new(limits: &LimitsSection) -> Handshakes {
        Handshakes {
            all: Arc::new(Semaphore::new(limits.handshakes())),
            per_source: limits.handshakes_per_source(),
            by_source: Default::default(),
        }
    }

    fn take(self: Arc<Self>, source: std::net::IpAddr) -> Option<Handshaking> {
        let slot = self.all.clone().try_acquire_owned().ok()?;
        {
            let mut by_source = self.by_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let count = by_source.entry(source).or_default();
            if *count >= self.per_source {
                return None;
            }
            *count += 1;
        }
        Some(Handshaking { _slot: slot, source, handshakes: self })
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut by_source = self.handshakes.by_source.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = by_source.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

async fn accept_loop<M, S>(
    listening: Listening,
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    make_service: M,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) -> anyhow::Result<()>
where
    M: Fn(Caller) -> S + Clone + Send + 'static,
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let capacity = Arc::new(Semaphore::new(listening.limits.max_connections));
    let handshaking = Arc::new(Handshakes::new(&listening.limits));
    let label = ListenerLabel { listener: listening.name };
    let (open, refused, handshakes_refused) = (
        listening.metrics.connections_open.get_or_create(&label).clone(),
        listening.metrics.connections_refused.get_or_create(&label).clone(),
        listening.metrics.handshakes_refused.get_or_create(&label).clone(),
    );
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let listening = listening.clone();
        match &tls {
            None => {
                // Over the cap: closed at once (accepting it takes it off the kernel's queue,
                // where it would wait unanswered), counted, and nothing is spent on it.
                let Some(held) = take_slot(&capacity, &open, &refused) else { continue };
                let service = make_service(Caller::anonymous());
                tokio::spawn(async move {
                    serve_connection(watcher, stream, service, &listening, None).await;
                    drop(held);
                });
            }
            Some(tls) => {
                // A handshake holds a handshake slot, not a connection slot: handshakes left
                // unfinished (by one address, or by all) never take the slots of connections
                // that finished theirs.
                let Some(handshake_slot) = handshaking.clone().take(peer.ip()) else {
                    handshakes_refused.inc();
                    drop(stream);
                    continue;
                };
                let handshake = tls.listener();
                let make_service = make_service.clone();
                let (capacity, open, refused) = (capacity.clone(), open.clone(), refused.clone());
                let tls = tls.clone();
                tokio::spawn(async move {
                    let metrics = &listening.metrics;
                    let accepting = handshake.acceptor().accept(stream);
                    let stream = match tokio::time::timeout(listening.limits.handshake_timeout(), accepting).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => {
                            metrics.failed(reason(&error));
                            tracing::debug!(%peer, %error, "TLS handshake refused");
                            return;
                        }
                        Err(_) => {
                            metrics.failed("timeout");
                            metrics.timed_out(listening.name, "handshake");
                            return;
                        }
                    };
                    let caller = match handshake.caller(stream.get_ref().1.peer_certificates()) {
                        Ok(caller) => caller,
                        Err(reason) => {
                            metrics.failed(reason);
                            tracing::warn!(%peer, reason, "a client certificate that names no caller it may be: closing");
                            return;
                        }
                    };
                    metrics.handshakes.inc();
                    drop(handshake_slot);
                    let Some(held) = take_slot(&capacity, &open, &refused) else { return };
                    let chain = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
                    let service = make_service(caller.clone());
                    let watch = (!chain.is_empty()).then(|| Certified { tls, handshake, chain, caller });
                    serve_connection(watcher, stream, service, &listening, watch).await;
                    drop(held);
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "in-flight requests did not finish in time; stopping anyway");
    }
    Ok(())
}

/// One HTTP/1.1 connection, watched for the graceful shutdown, and closed when a peer lets one of
/// the deadlines of `connection` pass.
async fn serve_connection<I, S>(
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    service: S,
    listening: &Listening,
    certified: Option<Certified>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let end_at = certified.as_ref().and_then(|certified| certified.chain.first()).and_then(not_after);
    let activity = Activity::new(&listening.limits, end_at, certified.is_some());
    // A reload checks the certificate again while the connection is open.
    let _watched =
        certified.map(|Certified { tls, handshake, chain, caller }| tls.watch(&handshake, chain, caller, &activity));
    let (bodies, answers) = (activity.clone(), activity.clone());
    let service = service
        .map_request(move |request: Request<hyper::body::Incoming>| {
            request.map(|body| Body::new(bodies.request_body(body)))
        })
        .map_future(move |answer: S::Future| {
            let activity = answers.clone();
            async move {
                let response = answer.await;
                activity.response_ready();
                response
            }
        });
    let io = TokioIo::new(ActivityIo::new(io, activity.clone()));
    let connection = hyper::server::conn::http1::Builder::new()
        .max_buf_size(listening.limits.max_header_bytes)
        .serve_connection(io, TowerToHyperService::new(service));
    // Polled again at once when it wakes itself (see `repoll`): one trip through the scheduler
    // less for every request with a body.
    match crate::repoll::Repoll::new(Guarded::new(watcher.watch(connection), activity)).await {
        Ok(Ok(())) => {}
        // hyper answered 431 itself: the request never reached a handler.
        Ok(Err(error)) if error.is_parse_too_large() => {
            listening.metrics.requests_too_large.get_or_create(&ListenerLabel { listener: listening.name }).inc();
            tracing::debug!(%error, "closing a connection whose request's headers passed limits.max_header_bytes");
        }
        Ok(Err(error)) => tracing::debug!(%error, "connection ended with an error"),
        Err(deadline) => {
            listening.metrics.timed_out(listening.name, deadline.label());
            tracing::debug!(deadline = deadline.label(), "closing a connection whose peer let a deadline pass");
        }
    }
}
