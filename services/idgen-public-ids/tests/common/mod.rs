//! What the router tests share: an instance of the service over a store, and one request to it
//! through the service as it serves a connection ([`App`]: the router, and its own answer to
//! `GET /v1/public-ids/{public_id}`). Each test file uses part of it.
#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use idgen_public_ids::access::Access;
use idgen_public_ids::cache::MappingCache;
use idgen_public_ids::format::{Format, OsRandom};
use idgen_public_ids::store::PublicIdStore;
use idgen_public_ids::{App, AppState};
use serde_json::Value;
use tower::ServiceExt;

/// An instance on `store` offering the stored formats (no data key), with a cache of
/// `max_entries` (0: none), everybody allowed, no quota, the OS's random source.
pub async fn instance(store: PublicIdStore, max_entries: u64) -> AppState {
    let gate = idgen_public_ids::store::check::gate_state(store.db()).await.unwrap();
    AppState {
        store: Arc::new(store),
        cache: Arc::new(MappingCache::new(max_entries)),
        keyring: None,
        quotas: Arc::new(idgen_server::Quotas::new(&Default::default(), Arc::default()).unwrap()),
        formats: [Format::Opaque, Format::Uuidv7].into(),
        access: Arc::new(Access::everybody()),
        random: Arc::new(OsRandom),
        random_failures: Arc::default(),
        types: Arc::default(),
        gate: Arc::new(idgen_public_ids::check::Gate::new(gate)),
    }
}

/// The service for a connection of `caller` (`anonymous`: plain HTTP), as it serves one.
pub fn app(state: &AppState, caller: &str) -> App {
    let metrics = idgen_server::ServiceMetrics::new(Default::default(), &idgen_public_ids::ROUTES, || {});
    idgen_public_ids::app(state.clone(), metrics).for_caller(idgen_server::Caller::named(caller))
}

/// One request: the status, the headers and the body as JSON (`null` if it is not).
pub async fn send(state: &AppState, method: Method, uri: &str, body: &str) -> (StatusCode, HeaderMap, Value) {
    send_as(state, idgen_server::identity::ANONYMOUS, method, uri, body).await
}

/// [`send`] on a connection of `caller`.
pub async fn send_as(
    state: &AppState,
    caller: &str,
    method: Method,
    uri: &str,
    body: &str,
) -> (StatusCode, HeaderMap, Value) {
    let request = Request::builder().method(method).uri(uri).body(Body::from(body.to_owned())).unwrap();
    let response = app(state, caller).oneshot(request).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// [`send_as`] without the headers.
pub async fn call_as(state: &AppState, caller: &str, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
    let (status, _, body) = send_as(state, caller, method, uri, body).await;
    (status, body)
}

/// [`send`] without the headers.
pub async fn call(state: &AppState, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
    let (status, _, body) = send(state, method, uri, body).await;
    (status, body)
}
