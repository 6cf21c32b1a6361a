//! The generator's Prometheus metrics: the same for a fleet worker and an embedded generator.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseEventLabel {
    pub layout: String,
    pub event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LayoutLabel {
    pub layout: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: String,
}

/// The audit spool's counts ([`crate::lease::audit_spool`]), per audit table. One set per process:
/// a spool belongs to the process, not to one generator.
#[derive(Default)]
pub struct AuditSpoolMetrics {
    pub waiting: Family<TableLabel, Gauge>,
    pub spooled: Family<TableLabel, Counter>,
    pub replayed: Family<TableLabel, Counter>,
    pub lost: Family<TableLabel, Counter>,
}

/// This process's audit spool metrics.
pub fn audit_spool() -> &'static AuditSpoolMetrics {
    static METRICS: std::sync::LazyLock<AuditSpoolMetrics> = std::sync::LazyLock::new(Default::default);
    &METRICS
}

#[derive(Default)]
pub struct GeneratorMetrics {
    pub ids_issued: Counter,
    pub uuids_issued: Counter,
    pub refusals: Family<ReasonLabel, Counter>,
    pub clock_behind_events: Counter,
    pub sequence_spills: Counter,
    pub lease_events: Family<LeaseEventLabel, Counter>,
    pub lease_remaining_seconds: Family<LayoutLabel, Gauge<f64, AtomicU64>>,
    pub lease_machine_number: Family<LayoutLabel, Gauge>,
    /// Numbers of the keeper's range no live lease holds, counted by a scan after each claim.
    pub lease_numbers_free: Family<LayoutLabel, Gauge>,
    /// 1 synchronized, 0 not, -1 check switched off (development).
    pub clock_synchronized: Gauge,
    /// The kernel's clock offset and estimated error (NaN: nothing to read).
    pub clock_offset_seconds: Gauge<f64, AtomicU64>,
    pub clock_estimated_error_seconds: Gauge<f64, AtomicU64>,
    /// 1 while the region is on standby (not the home region, before its first layout with a
    /// region field: every ID refused by design), else 0.
    pub region_standby: Gauge,
    /// 1 while the registry's latest answer was refused as contradicting the copy held (another
    /// registry identity, a schedule that goes back, the region renumbered): the generator
    /// issues on its copy until that copy's horizon, and pages. Else 0.
    pub registry_answer_refused: Gauge,
}

/// Every lease keeper event ([`GeneratorMetrics::lease_event`]), so each layout's series exist at
/// 0 from the start: an alert's `increase()` then sees a first event as it sees any other.
pub const LEASE_EVENTS: [&str; 14] = [
    "claim",
    "claim_adopted",
    "claim_all_taken",
    "claim_unusable",
    "renew",
    "renew_lost",
    "renew_not_forward",
    "lease_lapsed",
    "store_unavailable",
    "release",
    "keeper_restarted",
    "table_refused",
    "table_went_back",
    "row_vanished",
];

impl GeneratorMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for reason in idgen_core::Refusal::REASONS {
            let _ = self.refusals.get_or_create(&ReasonLabel { reason });
        }
        registry.register("idgen_ids_issued", "64-bit IDs issued", self.ids_issued.clone());
        registry.register("idgen_uuids_issued", "UUIDv7s issued", self.uuids_issued.clone());
        registry.register("idgen_refusals", "Requests refused, by reason", self.refusals.clone());
        registry.register(
            "idgen_clock_behind_events",
            "Times the wall clock read below the last issued timestamp (waited or refused)",
            self.clock_behind_events.clone(),
        );
        registry.register(
            "idgen_sequence_spills",
            "Times a millisecond's sequence was used up and issuing moved to the next millisecond",
            self.sequence_spills.clone(),
        );
        registry.register(
            "idgen_lease_events",
            "Lease keeper events: claim, claim_adopted, claim_all_taken, claim_unusable, renew, renew_lost, renew_not_forward, lease_lapsed, store_unavailable, release, keeper_restarted, table_refused, table_went_back, row_vanished (a claim made a row whose number the audit log shows held: parked for the longest lease)",
            self.lease_events.clone(),
        );
        registry.register(
            "idgen_lease_remaining_seconds",
            "Seconds until the fence of the held lease (negative: inside the fence)",
            self.lease_remaining_seconds.clone(),
        );
        registry.register(
            "idgen_lease_machine_number",
            "Machine number held, -1 if none",
            self.lease_machine_number.clone(),
        );
        registry.register(
            "idgen_lease_numbers_free",
            "Machine numbers of this generator's range that no live lease held at its last claim (0 when every one was taken)",
            self.lease_numbers_free.clone(),
        );
        registry.register(
            "idgen_clock_synchronized",
            "1 if the kernel reports the clock synchronized within bounds, 0 if not, -1 if the check is off",
            self.clock_synchronized.clone(),
        );
        registry.register(
            "idgen_clock_offset_seconds",
            "The offset the kernel's clock discipline is still correcting, signed (ahead is positive); NaN if unknown",
            self.clock_offset_seconds.clone(),
        );
        registry.register(
            "idgen_clock_estimated_error_seconds",
            "The kernel's estimated clock error (adjtimex esterror); NaN if unknown",
            self.clock_estimated_error_seconds.clone(),
        );
        registry.register(
            "idgen_region_standby",
            "1 while this region is on standby: not the home region, before its first layout with a region field (every ID refused by design); else 0",
            self.region_standby.clone(),
        );
        registry.register(
            "idgen_registry_answer_refused",
            "1 while the registry's latest answer contradicts the copy this generator holds (another registry identity: started over; a schedule that goes back: restored from a backup; the region renumbered): it issues on its copy until that copy's horizon, and reports its region number to that registry; else 0",
            self.registry_answer_refused.clone(),
        );
        let spool = audit_spool();
        registry.register(
            "idgen_audit_records_waiting",
            "Audit records the audit table would not take, spooled on local disk and not yet written to it",
            spool.waiting.clone(),
        );
        registry.register(
            "idgen_audit_records_spooled",
            "Audit records written to the local spool because the audit table would not take them",
            spool.spooled.clone(),
        );
        registry.register(
            "idgen_audit_records_replayed",
            "Spooled audit records written to the audit table once it answered",
            spool.replayed.clone(),
        );
        registry.register(
            "idgen_audit_records_lost",
            "Audit records neither written nor spooled (the spool failed too), or unreadable in the spool",
            spool.lost.clone(),
        );
    }

    /// Creates a layout's lease event series at 0 (the layouts come from the schedule, which can
    /// gain one while the process runs).
    pub fn layout_known(&self, layout: &str) {
        for event in LEASE_EVENTS {
            let _ = self.lease_events.get_or_create(&LeaseEventLabel { layout: layout.to_owned(), event });
        }
    }

    pub fn lease_event(&self, layout: &str, event: &'static str) {
        debug_assert!(LEASE_EVENTS.contains(&event), "lease event {event} is not in LEASE_EVENTS");
        self.lease_events.get_or_create(&LeaseEventLabel { layout: layout.to_owned(), event }).inc();
    }
}
