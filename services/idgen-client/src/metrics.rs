//! What the client counts: requests by endpoint and outcome, moves between endpoints, IDs held
//! and IDs dropped for age.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::failover::Move;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    endpoint: String,
    /// `ok`, `failed` (connection, timeout, 5xx: the next endpoint was tried), `over_quota`,
    /// `rejected`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveLabel {
    from: String,
    to: String,
    /// `failover` or `recovered`.
    why: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone)]
pub struct ClientMetrics {
    endpoints: Vec<String>,
    requests: Family<RequestLabel, Counter>,
    moves: Family<MoveLabel, Counter>,
    active: Family<EndpointLabel, Gauge>,
    pub(crate) buffered: Gauge,
    pub(crate) stale_ids: Counter,
}

impl ClientMetrics {
    pub(crate) fn new(endpoints: &[String]) -> Self {
        let metrics = ClientMetrics {
            endpoints: endpoints.to_vec(),
            requests: Family::default(),
            moves: Family::default(),
            active: Family::default(),
            buffered: Gauge::default(),
            stale_ids: Counter::default(),
        };
        for (index, endpoint) in endpoints.iter().enumerate() {
            metrics.active.get_or_create(&EndpointLabel { endpoint: endpoint.clone() }).set(i64::from(index == 0));
        }
        metrics
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "idgen_client_requests",
            "Requests to the fleet by endpoint and outcome",
            self.requests.clone(),
        );
        registry.register(
            "idgen_client_moves",
            "Requests moved between endpoints (failover, recovered)",
            self.moves.clone(),
        );
        registry.register("idgen_client_active_endpoint", "1 for the endpoint requests go to", self.active.clone());
        registry.register("idgen_client_buffered_ids", "Prefetched IDs held", self.buffered.clone());
        registry.register(
            "idgen_client_stale_ids",
            "Prefetched IDs dropped because their batch outlived the validity window",
            self.stale_ids.clone(),
        );
    }

    pub(crate) fn request(&self, endpoint: usize, outcome: &'static str) {
        self.requests.get_or_create(&RequestLabel { endpoint: self.endpoints[endpoint].clone(), outcome }).inc();
    }

    pub(crate) fn moved(&self, moved: &Move) {
        let (from, to) = (self.endpoints[moved.from].clone(), self.endpoints[moved.to].clone());
        self.active.get_or_create(&EndpointLabel { endpoint: from.clone() }).set(0);
        self.active.get_or_create(&EndpointLabel { endpoint: to.clone() }).set(1);
        self.moves.get_or_create(&MoveLabel { from, to, why: moved.why.as_str() }).inc();
    }

    /// Moves so far from `from` to `to`, for any reason.
    pub fn moves_between(&self, from: &str, to: &str) -> u64 {
        ["failover", "recovered"]
            .into_iter()
            .map(|why| self.moves.get_or_create(&MoveLabel { from: from.into(), to: to.into(), why }).get())
            .sum()
    }

    /// Requests to `endpoint` with `outcome`.
    pub fn requests(&self, endpoint: &str, outcome: &'static str) -> u64 {
        self.requests.get_or_create(&RequestLabel { endpoint: endpoint.into(), outcome }).get()
    }

    /// Prefetched IDs dropped for age.
    pub fn stale_ids(&self) -> u64 {
        self.stale_ids.get()
    }
}
