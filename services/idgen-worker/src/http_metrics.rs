//! Request counts by route and status, and a latency histogram by route.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
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

pub struct HttpMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RouteLabel, Histogram, fn() -> Histogram>,
}

impl HttpMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Arc::new(HttpMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        });
        registry.register("idgen_http_requests", "HTTP requests by method, route and status", metrics.requests.clone());
        registry.register(
            "idgen_http_request_duration_seconds",
            "HTTP request latency by route",
            metrics.latency.clone(),
        );
        metrics
    }
}

pub async fn record(State(metrics): State<Arc<HttpMetrics>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    // Callers choose the method: only the standard ones become label values, or a client sending
    // made-up methods would grow the label set (and /metrics) without bound.
    let method = match *request.method() {
        Method::GET | Method::POST | Method::PUT | Method::DELETE | Method::HEAD | Method::OPTIONS | Method::PATCH => {
            request.method().as_str()
        }
        _ => "other",
    }
    .to_owned();
    let start = Instant::now();
    let response = next.run(request).await;
    let elapsed = start.elapsed().as_secs_f64();
    metrics.latency.get_or_create(&RouteLabel { route: route.clone() }).observe(elapsed);
    metrics.requests.get_or_create(&RequestLabels { method, route, status: response.status().as_u16() }).inc();
    response
}
