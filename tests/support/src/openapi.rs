//! What each service's router test holds its OpenAPI document to (the worker's, the registry's
//! and the public-ID service's). The live contract, every response against its schema, is
//! schemathesis's job (`scripts/api-check`); this keeps the document from drifting from the
//! router in a plain `cargo test`.

use serde_json::Value;

/// One documented operation.
pub struct Operation {
    pub method: String,
    pub path: String,
    pub responses: Value,
}

/// Checks that `served` is OpenAPI 3.1, is the checked-in `file`, and names exactly `routes` (as
/// the router labels them: `route_of` maps a documented path to its route, several paths may
/// share one), and returns its operations.
pub fn operations(served: &Value, file: &str, routes: &[&str], route_of: impl Fn(&str) -> String) -> Vec<Operation> {
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(served, &checked_in, "the served document is not {file}");
    assert_eq!(served["openapi"], "3.1.0");
    let paths = served["paths"].as_object().unwrap();
    let mut documented: Vec<String> = paths.keys().map(|p| route_of(p)).collect();
    let mut routes: Vec<String> = routes.iter().map(|r| r.to_string()).collect();
    documented.sort_unstable();
    documented.dedup();
    routes.sort_unstable();
    assert_eq!(documented, routes, "documented paths and the router's routes differ");
    let mut operations = Vec::new();
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].clone();
            assert!(responses["405"].is_object(), "{method} {path}: 405 is not documented");
            operations.push(Operation { method: method.to_uppercase(), path: path.clone(), responses });
        }
    }
    operations
}

/// The `Allow` header a path with these documented methods answers a 405 with (axum answers
/// `HEAD` wherever it answers `GET`).
pub fn allow(methods: &[&str]) -> String {
    let mut allowed: Vec<&str> = methods.to_vec();
    if allowed.contains(&"GET") {
        allowed.push("HEAD");
    }
    allowed.sort_unstable();
    allowed.join(", ")
}

/// The methods a path does not take, to be answered 405 with its `Allow`.
pub fn undocumented(methods: &[&str]) -> Vec<&'static str> {
    ["GET", "POST", "PUT", "DELETE", "PATCH"].into_iter().filter(|m| !methods.contains(m)).collect()
}
