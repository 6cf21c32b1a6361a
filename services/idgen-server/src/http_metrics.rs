//! Request counts by route and status, and a latency histogram by route.
//!
//! Every service records around its whole router, never as a layer on each route (axum boxes a
//! layered route again, and clones those boxes, on every request): through [`Recorded`], which
//! finds the route of a request's path itself, with the router axum uses, inside
//! [`crate::App`] (whose route answered before the router names itself). Each
//! route's histogram and its counters for the usual statuses are looked up in the families once,
//! on first use, and kept. The series and their labels are exactly those of a plain `Family`
//! lookup.

use std::sync::{Arc, OnceLock};

use axum::http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

fn latency_histogram() -> Histogram {
    // 10 µs … ~5 s
    Histogram::new(exponential_buckets(0.000_01, 2.5, 15))
}

/// The statuses whose counters are kept per route and method (others go through the family).
const KEPT_STATUSES: [u16; 8] = [200, 201, 400, 404, 405, 413, 429, 503];
/// The methods the kept counters are for (others go through the family).
const KEPT_METHODS: [Method; 2] = [Method::GET, Method::POST];

/// One route's handles, filled on first use.
struct RouteHandles {
    route: &'static str,
    latency: OnceLock<Histogram>,
    /// `[method][status]`, in the order of `KEPT_METHODS` and `KEPT_STATUSES`.
    requests: [[OnceLock<Counter>; KEPT_STATUSES.len()]; KEPT_METHODS.len()],
}

pub struct HttpMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RouteLabel, Histogram, fn() -> Histogram>,
    routes: Vec<RouteHandles>,
}

impl HttpMetrics {
    /// Registers the metrics; `routes` are the router's paths, whose handles are kept.
    pub fn register(registry: &mut Registry, routes: &[&'static str]) -> Arc<Self> {
        let metrics = Arc::new(HttpMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            routes: routes
                .iter()
                .map(|route| RouteHandles { route, latency: OnceLock::new(), requests: Default::default() })
                .collect(),
        });
        registry.register("idgen_http_requests", "HTTP requests by method, route and status", metrics.requests.clone());
        registry.register(
            "idgen_http_request_duration_seconds",
            "HTTP request latency by route",
            metrics.latency.clone(),
        );
        metrics
    }

    /// Creates at 0 the request counter of every operation `openapi` (the service's OpenAPI
    /// document, held to its router by a test) documents, each status it answers but 405 (what
    /// the *other* methods get), and each such route's latency histogram: the series an alert or
    /// a dashboard reads exist from start-up, so the first 503 is an increase like any other.
    /// `route_of` maps a documented path to the route it is served under (one of `routes`).
    pub fn create_documented(&self, openapi: &str, route_of: impl Fn(&str) -> String) {
        let document: serde_json::Value =
            serde_json::from_str(openapi).expect("the service's OpenAPI document is JSON (its router test reads it)");
        for (path, item) in document["paths"].as_object().into_iter().flatten() {
            let route = route_of(path);
            let Some(handles) = self.routes.iter().find(|handles| handles.route == route) else {
                continue;
            };
            let _ = self.latency.get_or_create(&RouteLabel { route: route.clone() });
            for (method, operation) in item.as_object().into_iter().flatten() {
                let Ok(method) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else { continue };
                let statuses = operation["responses"].as_object().into_iter().flatten();
                for status in statuses.filter_map(|(status, _)| status.parse::<u16>().ok()).filter(|s| *s != 405) {
                    let labels =
                        RequestLabels { method: label(&method).to_owned(), route: handles.route.to_owned(), status };
                    let _ = self.requests.get_or_create(&labels);
                }
            }
        }
    }

    /// Counts one request of `route` and observes its latency.
    pub fn record(&self, route: &'static str, method: &Method, status: u16, elapsed_seconds: f64) {
        let Some(handles) = self.routes.iter().find(|handles| handles.route == route) else {
            return self.record_by_labels(route, method, status, elapsed_seconds);
        };
        handles
            .latency
            .get_or_init(|| self.latency.get_or_create(&RouteLabel { route: route.to_owned() }).clone())
            .observe(elapsed_seconds);
        let kept = KEPT_METHODS.iter().position(|m| m == method).zip(KEPT_STATUSES.iter().position(|s| *s == status));
        match kept {
            Some((m, s)) => handles.requests[m][s]
                .get_or_init(|| {
                    let labels = RequestLabels { method: label(method).to_owned(), route: route.to_owned(), status };
                    self.requests.get_or_create(&labels).clone()
                })
                .inc(),
            None => {
                let labels = RequestLabels { method: label(method).to_owned(), route: route.to_owned(), status };
                self.requests.get_or_create(&labels).inc()
            }
        };
    }

    fn record_by_labels(&self, route: &str, method: &Method, status: u16, elapsed_seconds: f64) {
        self.latency.get_or_create(&RouteLabel { route: route.to_owned() }).observe(elapsed_seconds);
        let labels = RequestLabels { method: label(method).to_owned(), route: route.to_owned(), status };
        self.requests.get_or_create(&labels).inc();
    }
}

/// Callers choose the method: only the standard ones become label values, or a client sending
/// made-up methods would grow the label set (and /metrics) without bound.
fn label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// The route label of a request whose path no route matches, in every service: no caller's
/// path becomes a label.
pub const UNMATCHED: &str = "other";

/// The families every service's `/metrics` carries, and the route names its router matches.
#[derive(Clone)]
pub struct ServiceMetrics {
    pub http: Arc<HttpMetrics>,
    pub registry: Arc<Registry>,
    /// The routes, in the path router axum matches with (`matchit`), each naming itself.
    routes: Arc<matchit::Router<&'static str>>,
    /// Gauges read at scrape time (a database pool's connections, …).
    refresh: Arc<dyn Fn() + Send + Sync>,
}

impl ServiceMetrics {
    /// `registry` with the HTTP families registered for `routes`, and `refresh` run before every
    /// scrape.
    ///
    /// # Panics
    ///
    /// If `routes` are not routes axum could serve together (a service's constant list).
    pub fn new(mut registry: Registry, routes: &[&'static str], refresh: impl Fn() + Send + Sync + 'static) -> Self {
        let http = HttpMetrics::register(&mut registry, routes);
        let mut matcher = matchit::Router::new();
        for &route in routes {
            if let Err(error) = matcher.insert(route, route) {
                panic!("the route {route:?} cannot be served beside the others: {error}");
            }
        }
        ServiceMetrics { http, registry: Arc::new(registry), routes: Arc::new(matcher), refresh: Arc::new(refresh) }
    }

    /// The route axum serves `path` with, among the names given to [`Self::new`]: the label of a
    /// request's metrics ([`UNMATCHED`] for a path none of them matches).
    pub fn route_of(&self, path: &str) -> &'static str {
        self.routes.at(path).map_or(UNMATCHED, |matched| *matched.value)
    }

    /// The Prometheus text of every family, gauges refreshed first.
    pub fn render(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        (self.refresh)();
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            Ok(()) => (
                [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                text,
            )
                .into_response(),
            Err(error) => {
                tracing::error!(%error, "encoding the metrics");
                axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
            }
        }
    }
}

/// A service (a whole router) whose every request is counted by method, route and status, and
/// its latency observed by route ([`ServiceMetrics::route_of`]). Put around a whole router, never
/// on its routes (`Router::layer`): see the [module docs](self).
///
/// A service of its own rather than `axum::middleware::from_fn`: that boxes the inner service's
/// future and its own for every request, and on a cache hit of the public-ID service moving those
/// futures was a measurable part of the request's CPU. [`RecordedFuture`] is the inner future
/// with its [`Recording`] beside it.
#[derive(Clone)]
pub struct Recorded<S> {
    inner: S,
    metrics: ServiceMetrics,
}

impl<S> Recorded<S> {
    /// `inner` (a whole router), its requests recorded in `metrics`.
    pub fn new(inner: S, metrics: ServiceMetrics) -> Self {
        Recorded { inner, metrics }
    }

    /// A request for `route` with `method`, beginning now, to be recorded as this router records
    /// its own: for a service that answers one route itself, beside the router.
    pub fn recording(&self, route: &'static str, method: Method) -> Recording {
        Recording { http: self.metrics.http.clone(), route, method, start: std::time::Instant::now() }
    }
}

/// One request being answered: the route and method it is counted under, and when it began.
pub struct Recording {
    http: Arc<HttpMetrics>,
    route: &'static str,
    method: Method,
    start: std::time::Instant,
}

impl Recording {
    /// Counts the request answered `response` and observes its time since it began.
    pub fn record(self, response: &axum::response::Response) {
        let elapsed = self.start.elapsed().as_secs_f64();
        self.http.record(self.route, &self.method, response.status().as_u16(), elapsed);
    }
}

impl<S> tower::Service<axum::extract::Request> for Recorded<S>
where
    S: tower::Service<axum::extract::Request, Response = axum::response::Response>,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = RecordedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let recording = self.recording(self.metrics.route_of(request.uri().path()), request.method().clone());
        RecordedFuture { inner: self.inner.call(request), recording: Some(recording) }
    }
}

pin_project_lite::pin_project! {
    /// The inner future of a [`Recorded`] request; records the request when it is answered.
    pub struct RecordedFuture<F> {
        #[pin]
        inner: F,
        // Taken when the answer is recorded.
        recording: Option<Recording>,
    }
}

impl<F, E> std::future::Future for RecordedFuture<F>
where
    F: std::future::Future<Output = Result<axum::response::Response, E>>,
{
    type Output = Result<axum::response::Response, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let answered = std::task::ready!(this.inner.poll(cx));
        if let (Ok(response), Some(recording)) = (&answered, this.recording.take()) {
            recording.record(response);
        }
        std::task::Poll::Ready(answered)
    }
}

/// The database pool's gauges, registered in `registry`; the returned function sets them from
/// `read` (open, idle), for [`ServiceMetrics::new`]'s refresh.
pub fn pool_gauges(
    registry: &mut Registry,
    read: impl Fn() -> (u32, usize) + Send + Sync + 'static,
) -> impl Fn() + Send + Sync + 'static {
    use prometheus_client::metrics::gauge::Gauge;
    let (open, idle) = (Gauge::<i64>::default(), Gauge::<i64>::default());
    registry.register("idgen_db_pool_connections", "Open connections of the database pool", open.clone());
    registry.register("idgen_db_pool_idle_connections", "Idle connections of the database pool", idle.clone());
    move || {
        let (o, i) = read();
        open.set(i64::from(o));
        idle.set(i as i64);
    }
}

/// The answer to a `GET /metrics` from a caller `tls.metrics_readers` does not list (403
/// `forbidden`), `None` for one that may read it.
pub fn metrics_refused(caller: &crate::Caller) -> Option<axum::response::Response> {
    use axum::response::IntoResponse;
    if caller.reads_metrics() {
        return None;
    }
    let message =
        format!("the caller {:?} may not read /metrics (tls.metrics_readers does not list it)", caller.name());
    Some(crate::ApiError::forbidden("forbidden", message).into_response())
}

/// `router` with `GET /metrics`, and the request metrics around it.
pub fn with_metrics(router: axum::Router, metrics: ServiceMetrics) -> Recorded<axum::Router> {
    let scrape = metrics.clone();
    let router = router.route(
        "/metrics",
        axum::routing::get(move |caller: crate::Caller| {
            std::future::ready(metrics_refused(&caller).unwrap_or_else(|| scrape.render()))
        })
        .fallback(crate::not_allowed("GET, HEAD")),
    );
    Recorded::new(router, metrics)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::any;
    use tower::ServiceExt;

    use super::*;

    /// The routes of the registry and the public-ID service, every shape they use: static
    /// segments, a `:batch` suffix, a parameter, and a parameter with a segment after it.
    const ROUTES: [&str; 13] = [
        "/v1/regions",
        "/v1/regions/{action}",
        "/v1/layouts",
        "/v1/public-ids",
        "/v1/public-ids:batch",
        "/v1/public-ids/{public_id}",
        "/v1/internal-ids/{internal_id}/public-id",
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/console",
        "/console/console.js",
        "/console/console.css",
    ];

    /// The label a request is recorded under is the route axum matches for its path, or `other`
    /// where axum falls back, for any path.
    #[tokio::test]
    async fn the_route_label_is_the_route_axum_matches() {
        let metrics = ServiceMetrics::new(Registry::default(), &ROUTES, || {});
        let paths = [
            "/v1/public-ids",
            "/v1/public-ids/",
            "/v1/public-ids:batch",
            "/v1/public-ids/order_01h455vb4pex5vsknk084sn02q",
            "/v1/public-ids/a/b",
            "/v1/public-ids/%2F",
            "/v1/public-ids%3Abatch",
            "/v1/internal-ids/5/public-id",
            "/v1/internal-ids//public-id",
            "/v1/internal-ids/5/public-id/",
            "/v1/regions/eu-west-1:retire",
            "/V1/regions",
            "//v1/regions",
            "/",
            "/metrics/",
            "/v1/public-ids/{public_id}",
            "/v1/regions/*",
        ];
        let segments = ["v1", "public-ids", "public-ids:batch", "internal-ids", "public-id", "regions", "x", "", "%20"];
        idgen_test_support::routes::assert_labels_are_axums(&ROUTES, "other", &paths, &segments, |path| {
            metrics.route_of(path).to_owned()
        })
        .await;
    }

    /// A router wrapped in [`Recorded`] counts each request under its route, and anything
    /// unmatched under `other`.
    #[tokio::test]
    async fn a_recorded_router_counts_by_route() {
        let metrics = ServiceMetrics::new(Registry::default(), &ROUTES, || {});
        let router = axum::Router::new().route("/v1/public-ids/{public_id}", any(|| async { "found" }));
        let app = with_metrics(router, metrics.clone());
        for path in ["/v1/public-ids/x", "/v1/public-ids/y", "/nowhere"] {
            let request = Request::builder().uri(path).body(Body::empty()).unwrap();
            app.clone().oneshot(request).await.unwrap();
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        let count = |route: &str, status: u16| {
            let series = format!(r#"{{method="GET",route="{route}",status="{status}"}} "#);
            text.lines().find(|line| line.contains(&series)).map(|line| line.rsplit(' ').next().unwrap().to_owned())
        };
        assert_eq!(count("/v1/public-ids/{public_id}", 200).as_deref(), Some("2"), "{text}");
        assert_eq!(count("other", 404).as_deref(), Some("1"), "{text}");
    }
}
