//! The control side: it owns what changes a generator's plan over time (the [`supervisor`] that
//! runs a lease keeper per layout, the [`registry`] client and its disk copy, the registry's
//! client [`tls`]) and never issues an ID or runs on the request path.

pub mod registry;
pub mod supervisor;
pub mod tls;
