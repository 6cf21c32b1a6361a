//! What every idgen service shares (the worker, the registry, the public-ID service), its one
//! home of plumbing: the one error and its body, and the reading of a request's body
//! ([`error`]); the command line, log, stop signals and exit status of a service process
//! ([`cli`]); TLS and mutual TLS with reload on SIGHUP, the caller's identity taken once per
//! connection at the handshake, per-caller quotas, the accept loop with its graceful shutdown,
//! and the `[limits]` every listener holds its peers to (a connection cap and a deadline on every
//! wait).
//!
//! A certificate names its caller in one configured form (`[tls] identity`: the URI SAN, or in
//! development the CN); reserved names are refused; only a certificate of the separate operator
//! CA can make an operator; revoked certificates (`[tls] crl`) are refused at the handshake.
//!
//! A connection's caller reaches the service built for that connection ([`serve()`] calls a
//! factory with it, [`App::for_caller`]); handlers behind an axum router read it as an extractor
//! ([`Caller`]) from the request extension [`App`] sets. Nothing re-reads a certificate per
//! request. [`app`] is the one way a service answers ([`App`]) and serves ([`Listeners`]).

pub mod app;
pub mod cli;
mod connection;
#[cfg(feature = "database")]
pub mod database;
pub mod error;
pub mod http_metrics;
pub mod identity;
pub mod limits;
pub mod pki;
pub mod quota;
pub mod repoll;
pub mod serve;
pub mod tls;

use axum::response::Response;

pub use app::{App, FastRoute, Listeners, NoFastRoute};
pub use cli::{ServiceArgs, ServiceConfig};
pub use error::{ApiError, read_body, read_json};
pub use http_metrics::ServiceMetrics;
pub use identity::{ANONYMOUS, Caller, IdentityForm, NoCaller, RESERVED};
pub use idgen::control::tls::ClientTlsSection;
pub use limits::LimitsSection;
pub use quota::{OverQuota, QuotaMetrics, QuotaSection, Quotas, Rate};
pub use serve::{ServerMetrics, serve, serve_health};
pub use tls::{Tls, TlsSection};

/// The answer of a route to a method it does not take, the same in every service: 405
/// `method_not_allowed` in the `{"error": {"code", "message"}}` shape, with the `Allow` header
/// RFC 9110 requires (`allow` lists the route's methods, e.g. `"GET, HEAD"`).
pub fn method_not_allowed(allow: &'static str) -> Response {
    use axum::http::{HeaderValue, StatusCode, header};
    use axum::response::IntoResponse;
    let message = format!("this endpoint does not accept that method; it takes {allow}");
    let mut response = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message).into_response();
    response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// A route's fallback (`MethodRouter::fallback`) for the methods it does not take:
/// [`method_not_allowed`] with `allow`.
pub fn not_allowed(
    allow: &'static str,
) -> impl FnOnce() -> std::future::Ready<Response> + Clone + Send + Sync + 'static {
    move || std::future::ready(method_not_allowed(allow))
}

/// `GET /openapi.json` of a service: its OpenAPI document (checked in under `docs/openapi/` and
/// compiled in) as JSON, and the 405 for every other method.
pub fn openapi_route<S>(document: impl Into<axum::body::Bytes>) -> axum::routing::MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    use axum::response::IntoResponse;
    let document: axum::body::Bytes = document.into();
    let serve = move || {
        let document = document.clone();
        std::future::ready(([(axum::http::header::CONTENT_TYPE, "application/json")], document).into_response())
    };
    axum::routing::get(serve).fallback(not_allowed("GET, HEAD"))
}

/// Refuses a reload whose file says `development` otherwise than the process started with: a
/// production process never takes development's allowances (plain HTTP, `cn` identities, local
/// keys) from an edited file, nor the reverse, without a restart.
pub fn refuse_mode_change(running: bool, fresh: bool) -> anyhow::Result<()> {
    if running != fresh {
        anyhow::bail!(
            "the file now says development = {fresh}, the process runs with development = {running}: the mode changes \
             only on a restart"
        );
    }
    Ok(())
}

/// Calls `reload` on every SIGHUP until the process ends (certificates, CA bundles and quotas
/// are re-read; a reload that fails is logged and changes nothing).
pub fn reload_on_sighup(reload: impl Fn() -> anyhow::Result<()> + Send + 'static) {
    #[cfg(unix)]
    tokio::spawn(async move {
        let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGHUP: certificates and quotas reload only on restart");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match reload() {
                Ok(()) => tracing::info!("SIGHUP: certificates and quotas reloaded"),
                Err(error) => {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "SIGHUP: reload refused; the configuration in force stays"
                    )
                }
            }
        }
    });
}
