//! The lease side: it owns the machine numbers (the [`LeaseStore`] trait and its SQLite and
//! DynamoDB tables, their conformance suite, the [`keeper`] that claims and renews, the audit
//! spool, the open lock) and is never called on the request path, nor ever issues an ID.
//!
//! The lease table: one row per machine number, changed only by conditional writes. Every
//! backend (SQLite here, DynamoDB in production) implements exactly the conditions of SPEC §2,
//! and passes the same conformance suite ([`conformance`], behind the `conformance` feature).

#[cfg(feature = "dynamodb")]
pub mod audit_spool;
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
pub mod genesis;
pub mod keeper;
pub mod open_lock;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use async_trait::async_trait;
use thiserror::Error;

pub use genesis::{Genesis, GenesisHow, GenesisRequest};

/// The holder written by a quarantine.
pub const QUARANTINED: &str = "QUARANTINED";
/// 2100-01-01T00:00:00Z: a quarantined row's expiry, so nobody's `lease_expiry < :now` holds.
pub const QUARANTINE_EXPIRY_UNIX_MS: i64 = 4_102_444_800_000;

/// The lease table a layout's generators use where nothing names another: `idgen-leases` for v1
/// (SPEC §2), `idgen-leases-<layout>` for every later layout (v2: `idgen-leases-v2`). The registry
/// names these for a region unless told others when the region is added.
pub fn default_table(layout: &str) -> String {
    match layout {
        "v1" => "idgen-leases".to_owned(),
        other => format!("idgen-leases-{other}"),
    }
}

/// What a generator asks before it claims in a table, besides the table's own word (its genesis,
/// [`LeaseStore::check_claimable`]): the registry's, that the table is its region's
/// ([`crate::control::registry::RegistrySnapshot::check_lease_table`]). `Err`: why not.
pub trait TableCheck: Send + Sync {
    fn check(&self, layout: &str, table: &str, genesis: &Genesis) -> Result<(), String>;

    /// Before every renewal: the registry still names `table` for the region and layout (a
    /// region moved to another table stops renewing in the old one).
    fn still_named(&self, layout: &str, table: &str) -> Result<(), String>;
}

/// The longest lease any generator may hold (validated at start-up, [`crate::LeaseConfig`]).
/// Lifting a quarantine keeps the number unclaimable at least this long, so a holder the
/// quarantine cut off is past its own expiry first, whatever lease it was configured with.
pub const MAX_LEASE_MS: i64 = 3_600_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub machine_id: u32,
    pub holder: String,
    /// Unix ms, by the holder's clock.
    pub lease_expiry: i64,
    pub lease_epoch: u64,
    /// The random token of the claim that made this lease (absent on rows written by a
    /// quarantine, a lift, or by hand).
    pub claim_token: Option<String>,
    /// While quarantined: the expiry the row had before, which a holder cut off by the
    /// quarantine may still believe it holds. Lifting never sets the expiry below it.
    pub expiry_before_quarantine: Option<i64>,
}

impl LeaseRow {
    /// Whether this row is what our own claim left: it names us and carries the token only that
    /// claim attempt drew. Holder and expiry alone cannot tell two claimants apart; the token
    /// alone would also match a row someone rewrote without removing it (the AWS CLI
    /// playbook's quarantine, an older binary's claim).
    pub fn claimed_by(&self, holder: &str, token: &ClaimToken) -> bool {
        self.holder == holder && self.claim_token.as_deref() == Some(token.as_str())
    }

    /// Whether this row is what our own renewal left: our holder, our epoch and the new expiry.
    /// Holders are unique per process and one process keeps one lease per table (see
    /// [`crate::LeaseKeeper::new`]), so nobody else writes this holder on this row.
    pub fn renewed_by(&self, holder: &str, epoch: u64, expiry_unix_ms: i64) -> bool {
        self.holder == holder && self.lease_epoch == epoch && self.lease_expiry == expiry_unix_ms
    }
}

/// 128 random bits drawn for one claim attempt (and kept for its retries), written on the row,
/// so a retry can tell its own applied claim from anyone else's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    pub fn random() -> Self {
        ClaimToken(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The condition held: the row now names us, with this epoch and expiry.
    Claimed(LeaseRow),
    /// The number is held by someone whose lease has not expired by our clock (or quarantined).
    Taken,
}

/// How a quarantine is lifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lift {
    /// The earliest expiry the lifted row may have: now + [`MAX_LEASE_MS`] by the operator's
    /// clock. With a kept expiry the lift takes the later of the two, so the operator's clock
    /// never moves a holder's expiry back.
    pub min_expiry_unix_ms: i64,
    /// The operator has seen that the number's last holder is stopped: a row without a kept
    /// expiry is lifted too. A stopped holder issues nothing more, and what it issued carries its
    /// own clock's milliseconds, which a successor claiming after it starts above as long as the
    /// two generators' clocks (each held to the synchronization check) agree.
    pub holder_stopped: bool,
}

/// What a lift found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiftOutcome {
    /// Lifted: the row now, whose expiry is when the number becomes claimable.
    Lifted(LeaseRow),
    /// The row is not quarantined (or does not exist).
    NotQuarantined,
    /// Quarantined without a kept expiry, and the holder was not said to be stopped: refused,
    /// nothing changed.
    NoKeptExpiry,
}

/// The outcome of a conditional write other than a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conditional {
    Applied,
    ConditionFailed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditKind {
    Claim,
    RenewFailed,
    Release,
    Quarantine,
    ReleaseQuarantine,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Claim => "claim",
            AuditKind::RenewFailed => "renew_failed",
            AuditKind::Release => "release",
            AuditKind::Quarantine => "quarantine",
            AuditKind::ReleaseQuarantine => "release_quarantine",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::Claim, Self::RenewFailed, Self::Release, Self::Quarantine, Self::ReleaseQuarantine]
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

/// One durable audit record: who did what to which machine number, when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub machine_id: u32,
    pub kind: AuditKind,
    /// The holder that acted (or the operator, for quarantines).
    pub holder: String,
    pub lease_epoch: u64,
    pub lease_expiry: i64,
    /// When, by the actor's clock (Unix ms).
    pub at_unix_ms: i64,
}

impl AuditEvent {
    pub fn new(
        kind: AuditKind,
        machine_id: u32,
        holder: &str,
        lease_epoch: u64,
        lease_expiry: i64,
        at_unix_ms: i64,
    ) -> Self {
        AuditEvent { machine_id, kind, holder: holder.to_owned(), lease_epoch, lease_expiry, at_unix_ms }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The table could not be reached or answered with a retryable error (throttling, timeout).
    /// The write may or may not have been applied.
    #[error("lease table unavailable: {0}")]
    Unavailable(String),
    /// The table answered with something that cannot be a lease row.
    #[error("lease table holds an invalid row: {0}")]
    Invalid(String),
    /// The table is no longer the one this handle opened: a SQLite file replaced under the
    /// process (a copy put in its place) or removed. The leases this process holds were written
    /// in the old one, which no process opening the table now sees: it stops issuing under them
    /// at once and claims in the table no more.
    #[error("lease table replaced: {0}")]
    Replaced(String),
    /// This process was forked from one that has the table's SQLite file open, and may not open
    /// it: its SQLite would share no locks with its parent's (the SQLite store's record of open files).
    #[error("lease table not for a forked process: {0}")]
    Forked(String),
    /// The table does not exist or has the wrong key schema: an operator must act.
    #[error("lease table misconfigured: {0}")]
    Misconfigured(String),
}

#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// A name for logs and health reports (the table name).
    fn describe(&self) -> String;

    /// Who this table is, for the one-keeper-per-table rule: the same for two handles on one table.
    fn table_key(&self) -> String;

    /// The table's name, as configuration gives it and the registry names it.
    fn table_name(&self) -> String;

    /// The table's genesis record ([`genesis`]), if it has one.
    async fn genesis(&self) -> Result<Option<Genesis>, StoreError>;

    /// Writes the table's genesis as [`genesis::decide`] rules (at most once for `init`; an
    /// adoption writes its own) and returns the record the table now holds. A refusal of the rule
    /// is `Misconfigured`. Only `idgen leases init`, `idgen leases adopt` and development's
    /// `lease.create_tables` call it.
    async fn record_genesis(&self, request: &GenesisRequest, now_unix_ms: i64) -> Result<Genesis, StoreError>;

    /// `attribute_not_exists(machine_id) OR lease_expiry < :now` → set holder, expiry, the claim
    /// token and epoch + 1. A failed condition on a row that already carries `token` is our own
    /// earlier attempt (its answer was lost): `Claimed`, and recorded in the audit if it was not.
    async fn claim_as(
        &self,
        machine: u32,
        holder: &str,
        token: &ClaimToken,
        now_unix_ms: i64,
        expiry_unix_ms: i64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Whether this table may be claimed in at all, asked before every sweep of claims and at a
    /// generator's start; its genesis, for the registry's checks. `Misconfigured`: a table without
    /// a genesis of its own (a fresh table beside the live one, or a copy of another: nothing says
    /// who holds its numbers), and a restored copy (DynamoDB restores to a new table: point in
    /// time, or a backup), whose expiries are from before the restore point while the holders of
    /// the numbers since then may still be issuing under them elsewhere, until an operator has
    /// adopted it (`idgen leases adopt`, runbooks/lease-table-restore.md).
    async fn check_claimable(&self) -> Result<Genesis, StoreError>;

    /// Lets go of the table (a SQLite file's connections: a process forked from this one may then
    /// open it). The handle is not used afterwards.
    async fn close(&self) {}

    /// A claim with a fresh token.
    async fn claim(
        &self,
        machine: u32,
        holder: &str,
        now_unix_ms: i64,
        expiry_unix_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_as(machine, holder, &ClaimToken::random(), now_unix_ms, expiry_unix_ms).await
    }

    /// `holder = :me AND lease_epoch = :my_epoch AND lease_expiry < :new_expiry AND lease_expiry >
    /// :live_after` → set expiry. `live_after` is the renewing clock's now plus the fence: a lease
    /// the table shows at or past its fence is not the renewal's to revive (a freeze between the
    /// keeper's check and the write, a table put back under it). `Applied` exactly when the row
    /// afterwards names us, our epoch and `new_expiry` — so a retry that meets its own first
    /// attempt is `Applied`, not a lost lease. A failed condition is recorded in the audit log.
    async fn renew(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        new_expiry_unix_ms: i64,
        live_after_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError>;

    /// `holder = :me AND lease_epoch = :my_epoch` → set expiry (last issued timestamp + 1).
    async fn release(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        expiry_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError>;

    /// Unconditional: holder `QUARANTINED`, expiry 2100-01-01, epoch + 1 (the row is created if
    /// absent). The expiry it had is kept in `expiry_before_quarantine` (a second quarantine keeps
    /// the first one's).
    async fn quarantine(&self, machine: u32, operator: &str, now_unix_ms: i64) -> Result<LeaseRow, StoreError>;

    /// Lifts a quarantine: holder `released-by:<operator>`, epoch + 1, and an expiry of the later
    /// of `expiry_before_quarantine` and `min_expiry_unix_ms`, so no holder cut off by the
    /// quarantine can still be issuing when a new claim succeeds. A row quarantined without a kept
    /// expiry (by the design notes' AWS CLI command, or by hand) is lifted only when `lift` says
    /// its last holder is stopped ([`LiftOutcome::NoKeptExpiry`] otherwise): nothing else on the
    /// row bounds what that holder may still believe it holds. A retry that meets its own applied
    /// lift returns the lifted row.
    async fn release_quarantine(
        &self,
        machine: u32,
        operator: &str,
        lift: Lift,
        now_unix_ms: i64,
    ) -> Result<LiftOutcome, StoreError>;

    async fn get(&self, machine: u32) -> Result<Option<LeaseRow>, StoreError>;

    /// Every row, by machine number.
    async fn list(&self) -> Result<Vec<LeaseRow>, StoreError>;

    /// Audit events in `[from, to]` (Unix ms), oldest first; one machine number or all.
    async fn history(
        &self,
        machine: Option<u32>,
        from_unix_ms: i64,
        to_unix_ms: i64,
    ) -> Result<Vec<AuditEvent>, StoreError>;
}
