//! What the worker's integration tests share.

use idgen_worker::config::WorkerConfig;

/// A development worker for region `eu-west-1` on a free port, its lease table and schedule copy
/// in `dir`, the sync check off, a 100 ms shutdown grace.
pub fn config_in(dir: &std::path::Path) -> WorkerConfig {
    let mut config = WorkerConfig::development();
    // The test's tables are its own: the worker makes them, genesis and all.
    config.lease.create_tables = true;
    (config.listen, config.shutdown_grace_ms) = ("127.0.0.1:0".parse().unwrap(), 100);
    config.region = Some("eu-west-1".into());
    config.schedule_cache = Some(dir.join("schedule.json"));
    config.clock.require_sync = false;
    config.lease.sqlite_path = Some(dir.join("leases.db"));
    config
}
