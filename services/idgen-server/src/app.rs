//! How every service answers and serves: the one way its requests are routed, labelled and
//! counted ([`App`]), and the one way its listeners are bound and served ([`Listeners`]).
//!
//! A service gives an axum router of its routes and its [`ServiceMetrics`]; [`App`] adds
//! `GET /metrics`, counts every request under its route (the service's route list, matched as
//! axum matches it), and hands each connection's caller to the handlers. A service whose busiest
//! route costs less than axum's router would add to it answers that route itself, before the
//! router ([`FastRoute`]): the worker's single ID, the public-ID service's resolve.
//!
//! Never here: a route of a service's own, a handler, or a decision about a request (quotas and
//! access are the services').

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use tokio::net::TcpListener;

pub use crate::http_metrics::Recording;
use crate::http_metrics::{Recorded, ServiceMetrics, with_metrics};
use crate::{Caller, LimitsSection, ServerMetrics, Tls};

/// The one route a service answers itself, before axum's router: its busiest, where the router's
/// matching, its extractors and the caller's request extension would cost about as much as the
/// request's own work. It must answer exactly what the router's route does; each service holds
/// it to that in a test.
pub trait FastRoute: Clone + Send + Sync + 'static {
    /// The label of the route, if `request` is for the route answered here.
    fn route(&self, request: &Request) -> Option<&'static str>;

    /// The answer to `request` (whose route [`Self::route`] named) from `caller`, boxed, telling
    /// `recording` the response once answered. The box is the implementor's to make, around the
    /// whole answer: a future made elsewhere and moved into a box of the same size cost a single
    /// ID several hundred instructions under callgrind (the copies, and an allocation past the
    /// allocator's per-thread cache).
    fn answer(&self, caller: &Caller, request: Request, recording: Recording) -> Answer;
}

/// A [`FastRoute`]'s answer: the request's whole future, in its box.
pub type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// No route answered before the router (the registry).
#[derive(Clone, Copy, Debug)]
pub enum NoFastRoute {}

impl FastRoute for NoFastRoute {
    fn route(&self, _: &Request) -> Option<&'static str> {
        match *self {}
    }

    fn answer(&self, _: &Caller, _: Request, _: Recording) -> Answer {
        match *self {}
    }
}

/// A service's HTTP service for one connection: [`FastRoute`]'s route answered first where there
/// is one, every other request through the router with the connection's caller in its
/// extensions (the [`Caller`] extractor), each counted and timed under its route.
#[derive(Clone)]
pub struct App<F = NoFastRoute> {
    fast: Option<F>,
    routed: Recorded<Router>,
    /// The caller of the connection this service answers (`anonymous` over plain HTTP).
    caller: Caller,
}

impl<F: FastRoute> App<F> {
    /// The service port's: `router` with `GET /metrics` (to the callers
    /// `tls.metrics_readers` lists), every request counted in `metrics`.
    pub fn new(router: Router, metrics: ServiceMetrics) -> Self {
        App { fast: None, routed: with_metrics(router, metrics), caller: Caller::anonymous() }
    }

    /// The health listener's: `router` (its `GET /healthz` alone) and no `/metrics`, counted in
    /// the same `metrics` as the service port.
    pub fn health(router: Router, metrics: ServiceMetrics) -> Self {
        App { fast: None, routed: Recorded::new(router, metrics), caller: Caller::anonymous() }
    }

    /// With `fast`'s route answered before the router.
    pub fn answering(self, fast: F) -> Self {
        App { fast: Some(fast), ..self }
    }

    /// The service for one connection of `caller`.
    pub fn for_caller(&self, caller: Caller) -> Self {
        App { caller, ..self.clone() }
    }
}

impl<F: FastRoute> tower::Service<Request> for App<F> {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        if let Some(fast) = &self.fast
            && let Some(route) = fast.route(&request)
        {
            let recording = self.routed.recording(route, request.method().clone());
            return fast.answer(&self.caller, request, recording);
        }
        request.extensions_mut().insert(self.caller.clone());
        Box::pin(tower::Service::call(&mut self.routed, request))
    }
}

/// A service's listeners: its port (`listen`) with its TLS where it has some, and its plain health
/// port (`health_listen`) where one is configured.
pub struct Listeners {
    pub service: TcpListener,
    /// The service port's TLS configuration in force (swapped on SIGHUP), if it uses TLS.
    pub tls: Option<Arc<Tls>>,
    pub health: Option<TcpListener>,
}

impl Listeners {
    /// Binds both, the service port to be served through `tls`; an address that cannot be bound
    /// is an error naming it.
    pub async fn bind(
        listen: std::net::SocketAddr,
        tls: Option<Arc<Tls>>,
        health_listen: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let service = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        let health = crate::serve::bind_health(health_listen).await?;
        Ok(Listeners { service, tls, health })
    }

    /// What a service's start-up line says of them (scripts and tests read it):
    /// `<scheme>://<address>`, then ` health=http://<address>` with a health port.
    pub fn describe(&self) -> std::io::Result<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let health = crate::serve::health_suffix(self.health.as_ref())?;
        Ok(format!("{scheme}://{}{health}", self.service.local_addr()?))
    }

    /// Serves `app` on the service port (through its TLS, each connection's caller the one its
    /// certificate names) and `health` on the health port, until `shutdown` resolves; then both
    /// stop accepting at once and let open connections finish within `grace`.
    pub async fn serve<F: FastRoute>(
        self,
        app: App<F>,
        health: App<F>,
        shutdown: impl Future<Output = ()> + Send,
        grace: Duration,
        metrics: Arc<ServerMetrics>,
        limits: LimitsSection,
    ) -> anyhow::Result<()> {
        let (shutdown, health_shutdown) = crate::serve::shared_shutdown(shutdown);
        let make = move |caller| app.for_caller(caller);
        let serving = crate::serve(self.service, self.tls, make, shutdown, grace, metrics.clone(), limits);
        let Some(listener) = self.health else { return serving.await };
        let checking = crate::serve_health(listener, health, health_shutdown, grace, metrics, limits);
        let (served, checked) = tokio::join!(serving, checking);
        served.and(checked)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use prometheus_client::registry::Registry;
    use tower::ServiceExt;

    use super::*;

    const ROUTES: [&str; 4] = ["/fast", "/routed", "/healthz", "/metrics"];

    /// Answers `GET /fast` with the caller's name, as a service's busiest route would.
    #[derive(Clone)]
    struct Fast;

    impl FastRoute for Fast {
        fn route(&self, request: &Request) -> Option<&'static str> {
            (request.method() == axum::http::Method::GET && request.uri().path() == "/fast").then_some("/fast")
        }

        fn answer(&self, caller: &Caller, _: Request, recording: Recording) -> Answer {
            let name = format!("fast {}", caller.name());
            Box::pin(async move {
                let response = axum::response::IntoResponse::into_response(name);
                recording.record(&response);
                Ok(response)
            })
        }
    }

    fn router() -> Router {
        Router::new()
            .route("/routed", get(|caller: Caller| async move { format!("routed {}", caller.name()) }))
            .route("/healthz", get(|| async { "ok" }))
    }

    async fn call<F: FastRoute>(app: &App<F>, method: &str, path: &str) -> (u16, String) {
        let request = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn count(metrics: &ServiceMetrics, method: &str, route: &str, status: u16) -> Option<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        let series = format!(r#"{{method="{method}",route="{route}",status="{status}"}} "#);
        text.lines().find(|line| line.contains(&series)).map(|line| line.rsplit(' ').next().unwrap().to_owned())
    }

    /// The fast route is answered by its own answer and counted under its label; every other
    /// request reaches the router with the connection's caller; `/metrics` is served; everything
    /// is counted in the one set of metrics.
    #[tokio::test]
    async fn the_fast_route_and_the_router_both_answer_with_the_caller_and_are_counted() {
        let metrics = ServiceMetrics::new(Registry::default(), &ROUTES, || {});
        let app = App::new(router(), metrics.clone()).answering(Fast).for_caller(Caller::named("shop"));
        assert_eq!(call(&app, "GET", "/fast").await, (200, "fast shop".into()));
        assert_eq!(call(&app, "GET", "/fast").await, (200, "fast shop".into()));
        assert_eq!(call(&app, "GET", "/routed").await, (200, "routed shop".into()));
        // Not the fast route's method: the router answers (it has no such route).
        assert_eq!(call(&app, "POST", "/fast").await.0, 404);
        let (status, text) = call(&app, "GET", "/metrics").await;
        assert_eq!(status, 200);
        assert!(text.contains("idgen_http_requests"), "{text}");
        assert_eq!(count(&metrics, "GET", "/fast", 200).as_deref(), Some("2"));
        assert_eq!(count(&metrics, "GET", "/routed", 200).as_deref(), Some("1"));
        assert_eq!(count(&metrics, "POST", "/fast", 404).as_deref(), Some("1"));
    }

    /// A health listener's service answers its router alone: no fast route, no `/metrics`, and
    /// it is counted in the service's metrics.
    #[tokio::test]
    async fn the_health_app_serves_its_router_alone() {
        let metrics = ServiceMetrics::new(Registry::default(), &ROUTES, || {});
        let health: App<Fast> = App::health(router(), metrics.clone());
        assert_eq!(call(&health, "GET", "/healthz").await, (200, "ok".into()));
        assert_eq!(call(&health, "GET", "/fast").await.0, 404);
        assert_eq!(call(&health, "GET", "/metrics").await.0, 404);
        assert_eq!(call(&health, "GET", "/routed").await, (200, "routed anonymous".into()));
        assert_eq!(count(&metrics, "GET", "/healthz", 200).as_deref(), Some("1"));
        assert_eq!(count(&metrics, "GET", "/metrics", 404).as_deref(), Some("1"));
    }
}
