//! The accept loop every idgen listener runs: plain HTTP (development, every caller `anonymous`)
//! or TLS, with the caller's identity taken once at the handshake and handed to the service made
//! for that connection; HTTP/1.1 with keep-alive; and a graceful shutdown that stops accepting,
//! lets in-flight requests finish within a grace period, then returns.

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
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::{Caller, Tls};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// TLS handshakes completed, and refused by reason.
#[derive(Default)]
pub struct ServerMetrics {
    handshakes: Counter,
    handshake_failures: Family<ReasonLabel, Counter>,
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
/// one connection from its caller.
pub async fn serve<M, S>(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    make_service: M,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
    metrics: Arc<ServerMetrics>,
) -> anyhow::Result<()>
where
    M: Fn(Caller) -> S + Clone + Send + 'static,
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
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
        match &tls {
            None => {
                let service = make_service(Caller::anonymous());
                tokio::spawn(async move { serve_connection(watcher, TokioIo::new(stream), service).await });
            }
            Some(tls) => {
                let (handshake, metrics) = (tls.listener(), metrics.clone());
                let make_service = make_service.clone();
                tokio::spawn(async move {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake.acceptor().accept(stream)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(error)) => {
                                metrics.failed(reason(&error));
                                tracing::debug!(%peer, %error, "TLS handshake refused");
                                return;
                            }
                            Err(_) => {
                                metrics.failed("timeout");
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
                    serve_connection(watcher, TokioIo::new(stream), make_service(caller)).await
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

/// One HTTP/1.1 connection, watched for the graceful shutdown.
async fn serve_connection<I, S>(watcher: hyper_util::server::graceful::Watcher, io: TokioIo<I>, service: S)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let service =
        TowerToHyperService::new(service.map_request(|request: Request<hyper::body::Incoming>| request.map(Body::new)));
    let connection = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    // Polled again at once when it wakes itself (see `repoll`): one trip through the scheduler
    // less for every request with a body.
    if let Err(error) = crate::repoll::Repoll::new(watcher.watch(connection)).await {
        tracing::debug!(%error, "connection ended with an error");
    }
}
