//! The registry's listener holds each caller to its quota (`[quotas]`, a request counting one),
//! as the worker's and the public-ID service's do: over it, 429 `over_quota` with `Retry-After`,
//! for reads as for writes; `/healthz` and `/metrics` are never held back; another caller is not
//! affected.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use idgen_registry::store::{InitialSchedule, RegistryStore};
use idgen_registry::{AppState, router, with_quotas};
use idgen_server::{Caller, QuotaSection, Quotas, Rate};
use tower::ServiceExt;

#[tokio::test]
async fn a_flood_of_reads_is_held_to_the_callers_quota() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    let store = RegistryStore::connect(&url, &InitialSchedule::spec_default("us-east-1")).await.unwrap();
    let state = AppState {
        store: Arc::new(store),
        operators: Arc::default(),
        certificate_operators: Arc::default(),
        refusals: Arc::default(),
        health: Arc::default(),
        horizon_lead_ms: 30 * 86_400_000,
        retire_grace_ms: 86_400_000,
        new_registry_quiet_ms: 0,
        lease_table_recorders: Arc::default(),
        now: || 1_795_000_000_000,
    };
    let section = QuotaSection {
        default: Some(Rate { ids_per_second: 1, burst: 3 }),
        callers: [("idgen-worker".to_owned(), Rate { ids_per_second: 1000, burst: 1000 })].into(),
    };
    let app = with_quotas(router(state), Arc::new(Quotas::new(&section, Arc::default()).unwrap()));
    let get = |path: &str, caller: &str| {
        let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
        request.extensions_mut().insert(Caller::named(caller));
        app.clone().oneshot(request)
    };
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get("/v1/layouts", "scraper").await.unwrap().status());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429].map(|s| StatusCode::from_u16(s).unwrap()));
    let over = get("/v1/regions", "scraper").await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(over.headers().get("retry-after").is_some(), "429 without Retry-After");
    let body = axum::body::to_bytes(over.into_body(), 4096).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "over_quota");
    // The health check is never held back, and a caller of its own quota is not affected.
    assert_eq!(get("/healthz", "scraper").await.unwrap().status(), StatusCode::OK);
    for _ in 0..20 {
        assert_eq!(get("/v1/layouts", "idgen-worker").await.unwrap().status(), StatusCode::OK);
    }
}
