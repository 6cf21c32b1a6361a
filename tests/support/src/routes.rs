//! What the HTTP metrics' own route label is held to: the route axum's router matches for a
//! path (its `MatchedPath`), or the label of its fallback, for named awkward paths and 2,000 made
//! of a service's own segments.

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::Request;
use axum::routing::any;
use tower::ServiceExt;

/// Fails naming the first path where `label` is not what axum matches among `routes`
/// (`fallback` where it matches none): each of `paths`, and 2,000 paths of 0 to 4 of `segments`.
pub async fn assert_labels_are_axums(
    routes: &[&'static str],
    fallback: &'static str,
    paths: &[&str],
    segments: &[&str],
    label: impl Fn(&str) -> String,
) {
    let mut echo = axum::Router::new();
    for route in routes {
        echo = echo.route(route, any(|matched: MatchedPath| async move { matched.as_str().to_owned() }));
    }
    let echo = echo.fallback(move || async move { fallback.to_owned() });
    let mut paths: Vec<String> = paths.iter().map(|path| (*path).to_owned()).collect();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..2_000 {
        let mut path = String::new();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        for i in 0..(seed % 5) {
            path.push('/');
            path.push_str(segments[((seed >> (8 * i + 8)) % segments.len() as u64) as usize]);
        }
        if path.is_empty() {
            path.push('/');
        }
        paths.push(path);
    }
    for path in paths {
        let request = Request::builder().uri(&path).body(Body::empty()).unwrap();
        let response = echo.clone().oneshot(request).await.unwrap();
        let matched = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
        assert_eq!(label(&path), String::from_utf8_lossy(&matched), "path {path:?}");
    }
}
