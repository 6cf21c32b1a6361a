//! The region registry: the control plane of SPEC §5. It hands out region numbers that are never
//! reused and publishes the layout schedule (layouts, their `from`, the horizon, the home region).
//! It changes only when a region or a layout is added, and nothing calls it per ID: generators
//! fetch it at start-up, keep the last good copy on disk and refresh it periodically.

pub mod store;
