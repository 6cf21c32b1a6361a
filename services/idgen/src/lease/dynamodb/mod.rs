//! The lease table on Amazon DynamoDB: the production backend.
//!
//! Every write uses exactly the condition expressions of SPEC §2, so the AWS CLI playbook in the
//! design notes (scan, get-item, the quarantine update-item) works against these tables verbatim.
//! `ConditionalCheckFailedException` is a typed outcome; throttling, timeouts and network errors
//! are retried by the SDK (standard mode: exponential backoff with jitter) and, if they persist,
//! surface as [`StoreError::Unavailable`] for the keeper to retry on its own schedule.
//!
//! A retried conditional write can meet its own first attempt (applied, but the answer lost).
//! `ReturnValuesOnConditionCheckFailure = ALL_OLD` shows the row as it was: if it already holds
//! exactly what we wrote, the write is ours and counts as applied.
//!
//! The audit log is a second table, `<table>-audit`: hash key `machine_id`, range key
//! `event_key` (`<20-digit Unix ms>#<event>#<random>`), so one machine number's history in a time
//! window is a single Query.
//!
//! Its rooms: `mod.rs` (here) holds the store and the lease operations, each one conditional
//! write ([`DynamoDbLeaseStore::write_if`]); [`item`] converts rows and errors; [`tables`]
//! creates and verifies the tables; [`adoption`] reads restores and carries rows over from the
//! table used before; [`audit`] writes and reads the audit table.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::lease::audit_spool::AuditSpool;
use crate::lease::genesis::{self, Genesis, GenesisHow, GenesisRequest, GenesisWrite};
use crate::lease::{
    AuditEvent, AuditKind, ClaimOutcome, ClaimToken, Conditional, LeaseRow, LeaseStore, Lift, LiftOutcome,
    QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError,
};
pub use adoption::{Adoption, Restored, table_of_arn};
use audit::AuditTable;
pub use idgen_aws::AwsSettings as DynamoDbSettings;
use item::{Item, already_ours, lease_row, n, number, old_item, s, string, unavailable};

mod adoption;
mod audit;
mod item;
mod tables;

/// A DynamoDB client (see [`idgen_aws::sdk_config`]).
pub async fn client(settings: &DynamoDbSettings) -> Client {
    Client::new(&idgen_aws::sdk_config(settings).await)
}

#[derive(Clone)]
pub struct DynamoDbLeaseStore {
    client: Client,
    table: String,
    audit: String,
    /// Where audit records the table would not take wait (none: they are only logged).
    spool: Option<Arc<AuditSpool>>,
}

/// How often a read-then-write (quarantine, lift) is tried again when the row changed between
/// the read and the conditional write.
const READ_WRITE_ATTEMPTS: usize = 5;

/// The key of the lease table's own record (an adoption, `idgen leases adopt`): a number no
/// machine can have, so no claim touches it; [`LeaseStore::list`] leaves it out.
pub const TABLE_RECORD_KEY: i64 = -1;

/// The key of the table's genesis ([`crate::lease::genesis`]), likewise no machine's.
pub const GENESIS_KEY: i64 = -2;

impl DynamoDbLeaseStore {
    /// A store on `table` (and its audit table `<table>-audit`). Does not create anything.
    pub fn new(client: Client, table: &str) -> Self {
        DynamoDbLeaseStore { client, table: table.to_owned(), audit: format!("{table}-audit"), spool: None }
    }

    /// Audit records the table would not take (after the SDK's retries) go to a spool in
    /// `dir`, fsynced, and are written by a background replayer once the table answers
    /// ([`crate::lease::audit_spool`]). Fails if `dir` cannot be written to.
    pub fn with_audit_spool(mut self, dir: &std::path::Path) -> std::io::Result<Self> {
        let sink = Arc::new(AuditTable(DynamoDbLeaseStore { spool: None, ..self.clone() }));
        self.spool = Some(AuditSpool::shared(dir, &self.audit, sink)?);
        Ok(self)
    }

    /// The spool this store's audit records wait in when the table refuses them.
    pub fn audit_spool(&self) -> Option<&Arc<AuditSpool>> {
        self.spool.as_ref()
    }

    /// A conditional update of one row's lease attributes, ALL_OLD on a failed condition.
    fn update(&self, machine: u32) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("machine_id", n(machine))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }

    pub fn audit_table(&self) -> &str {
        &self.audit
    }

    /// The one conditional write of a lease row: `update` ([`Self::update`]) sent once (the SDK
    /// retries it). A failed condition whose row as it was (`ALL_OLD`) `ours` says already holds
    /// what the write meant is our own earlier attempt, applied with its answer lost: it counts
    /// as applied, with that row.
    async fn write_if(
        &self,
        update: UpdateItemFluentBuilder,
        ours: impl FnOnce(&LeaseRow) -> bool,
    ) -> Result<Written, StoreError> {
        match update.send().await {
            // A write that asked for no row is answered without one (or with an empty one).
            Ok(output) => {
                Ok(Written::Applied(output.attributes().filter(|row| !row.is_empty()).map(lease_row).transpose()?))
            }
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                Ok(already_ours(old_item(e.err()), ours).map_or(Written::Refused, |row| Written::Applied(Some(row))))
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// [`Self::write_if`], answering the row after the write (`ALL_NEW`); `None` if refused.
    /// `what` names the write in the error of an answer without a row.
    async fn write_row_if(
        &self,
        update: UpdateItemFluentBuilder,
        what: &str,
        ours: impl FnOnce(&LeaseRow) -> bool,
    ) -> Result<Option<LeaseRow>, StoreError> {
        match self.write_if(update.return_values(ReturnValue::AllNew), ours).await? {
            Written::Applied(Some(row)) => Ok(Some(row)),
            Written::Applied(None) => Err(StoreError::Invalid(format!("{what} returned no row"))),
            Written::Refused => Ok(None),
        }
    }
}

/// What a conditional write of a lease row came to ([`DynamoDbLeaseStore::write_if`]).
enum Written {
    /// Applied, now or by our own earlier attempt: the row after it, where the write asked for
    /// it or the retry found it.
    Applied(Option<LeaseRow>),
    /// Its condition failed, and the row was not already what the write meant.
    Refused,
}

#[async_trait]
impl LeaseStore for DynamoDbLeaseStore {
    fn describe(&self) -> String {
        format!("dynamodb table {}", self.table)
    }

    fn table_key(&self) -> String {
        let region = self.client.config().region().map_or_else(String::new, ToString::to_string);
        format!("dynamodb:{region}:{}", self.table)
    }

    fn table_name(&self) -> String {
        self.table.clone()
    }

    async fn genesis(&self) -> Result<Option<Genesis>, StoreError> {
        let Some(item) = self.get_item(GENESIS_KEY).await? else { return Ok(None) };
        let how = string(&item, "how")?;
        let from = item.contains_key("adopted_from").then(|| string(&item, "adopted_from")).transpose()?;
        Ok(Some(Genesis {
            table_id: string(&item, "table_id")?,
            registry_id: item.contains_key("registry_id").then(|| string(&item, "registry_id")).transpose()?,
            how: GenesisHow::parse(&how, from).ok_or_else(|| StoreError::Invalid(format!("genesis how = {how:?}")))?,
            by: string(&item, "written_by")?,
            at_unix_ms: number(&item, "at_unix_ms")?,
            table_created_unix_ms: Some(number(&item, "table_created_unix_ms")?),
        }))
    }

    async fn record_genesis(&self, request: &GenesisRequest, now_unix_ms: i64) -> Result<Genesis, StoreError> {
        for _ in 0..READ_WRITE_ATTEMPTS {
            let (created, restored) = self.origin().await?;
            // A restored copy becomes the fleet's by an adoption, which writes its own genesis.
            if request.how == GenesisHow::Init
                && let Some(why) = self.unadopted_restore(created, restored).await?
            {
                return Err(StoreError::Misconfigured(why));
            }
            let existing = self.genesis().await?;
            let write = genesis::decide(existing.as_ref(), Some(created), request, &self.table, now_unix_ms)
                .map_err(StoreError::Misconfigured)?;
            let new = match write {
                GenesisWrite::Keep(genesis) => return Ok(genesis),
                GenesisWrite::Put(genesis) => genesis,
            };
            let mut update = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("machine_id", n(GENESIS_KEY))
                .expression_attribute_values(":id", s(&new.table_id))
                .expression_attribute_values(":how", s(new.how.kind()))
                .expression_attribute_values(":by", s(&new.by))
                .expression_attribute_values(":at", n(new.at_unix_ms))
                .expression_attribute_values(":created", n(created));
            let mut set = vec![
                "table_id = :id",
                "how = :how",
                "written_by = :by",
                "at_unix_ms = :at",
                "table_created_unix_ms = :created",
            ];
            let mut remove = Vec::new();
            match &new.registry_id {
                Some(registry) => {
                    set.push("registry_id = :registry");
                    update = update.expression_attribute_values(":registry", s(registry));
                }
                None => remove.push("registry_id"),
            }
            match new.how.adopted_from() {
                Some(from) => {
                    set.push("adopted_from = :from");
                    update = update.expression_attribute_values(":from", s(from));
                }
                None => remove.push("adopted_from"),
            }
            let mut expression = format!("SET {}", set.join(", "));
            if !remove.is_empty() {
                expression += &format!(" REMOVE {}", remove.join(", "));
            }
            // Over the record read, only if it is still that one.
            update = match &existing {
                None => update.condition_expression("attribute_not_exists(machine_id)"),
                Some(was) => update
                    .condition_expression("table_id = :was_id AND at_unix_ms = :was_at")
                    .expression_attribute_values(":was_id", s(&was.table_id))
                    .expression_attribute_values(":was_at", n(was.at_unix_ms)),
            };
            // Our own first attempt, applied with its answer lost, is kept by the next round's read.
            if let Written::Applied(_) = self.write_if(update.update_expression(expression), |_| false).await? {
                return Ok(new);
            }
        }
        Err(StoreError::Unavailable(format!(
            "the genesis of {} changed under {READ_WRITE_ATTEMPTS} writes in a row; try again",
            self.table
        )))
    }

    async fn check_claimable(&self) -> Result<Genesis, StoreError> {
        let (created, restored) = self.origin().await?;
        if let Some(why) = self.unadopted_restore(created, restored).await? {
            return Err(StoreError::Misconfigured(why));
        }
        let genesis = self.genesis().await?.ok_or_else(|| StoreError::Misconfigured(genesis::missing(&self.table)))?;
        if genesis.table_created_unix_ms != Some(created) {
            return Err(StoreError::Misconfigured(genesis::copied(&self.table, genesis.table_created_unix_ms)));
        }
        Ok(genesis)
    }

    async fn claim_as(
        &self,
        machine: u32,
        holder: &str,
        token: &ClaimToken,
        now_unix_ms: i64,
        expiry_unix_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let update = self
            .update(machine)
            .update_expression(
                "SET holder = :me, lease_expiry = :expiry, claim_token = :token, \
                 lease_epoch = if_not_exists(lease_epoch, :zero) + :one REMOVE expiry_before_quarantine",
            )
            .condition_expression("attribute_not_exists(machine_id) OR lease_expiry < :now")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":now", n(now_unix_ms))
            .expression_attribute_values(":expiry", n(expiry_unix_ms))
            .expression_attribute_values(":token", s(token.as_str()))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1));
        // Our own earlier attempt (an SDK retry, or the keeper's after a lost answer) is the one
        // row carrying our token. Its audit record may never have been written; one more, with
        // the same values, is better than none.
        let Some(row) = self.write_row_if(update, "claim", |row| row.claimed_by(holder, token)).await? else {
            return Ok(ClaimOutcome::Taken);
        };
        self.record_or_log(AuditEvent::new(
            AuditKind::Claim,
            machine,
            holder,
            row.lease_epoch,
            expiry_unix_ms,
            now_unix_ms,
        ))
        .await;
        Ok(ClaimOutcome::Claimed(row))
    }

    async fn renew(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        new_expiry_unix_ms: i64,
        live_after_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let update = self
            .update(machine)
            .update_expression("SET lease_expiry = :new_expiry")
            .condition_expression(
                "holder = :me AND lease_epoch = :my_epoch AND lease_expiry < :new_expiry AND lease_expiry > :live_after",
            )
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":my_epoch", n(epoch))
            .expression_attribute_values(":new_expiry", n(new_expiry_unix_ms))
            .expression_attribute_values(":live_after", n(live_after_unix_ms));
        match self.write_if(update, |row| row.renewed_by(holder, epoch, new_expiry_unix_ms)).await? {
            Written::Applied(_) => Ok(Conditional::Applied),
            Written::Refused => {
                self.record_or_log(AuditEvent::new(
                    AuditKind::RenewFailed,
                    machine,
                    holder,
                    epoch,
                    new_expiry_unix_ms,
                    now_unix_ms,
                ))
                .await;
                Ok(Conditional::ConditionFailed)
            }
        }
    }

    async fn release(
        &self,
        machine: u32,
        holder: &str,
        epoch: u64,
        expiry_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let update = self
            .update(machine)
            .update_expression("SET lease_expiry = :expiry")
            .condition_expression("holder = :me AND lease_epoch = :my_epoch")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":my_epoch", n(epoch))
            .expression_attribute_values(":expiry", n(expiry_unix_ms));
        // A retry that met its own release still matches the condition (only the expiry moved).
        if let Written::Refused = self.write_if(update, |_| false).await? {
            return Ok(Conditional::ConditionFailed);
        }
        self.record_or_log(AuditEvent::new(AuditKind::Release, machine, holder, epoch, expiry_unix_ms, now_unix_ms))
            .await;
        Ok(Conditional::Applied)
    }

    async fn quarantine(&self, machine: u32, operator: &str, now_unix_ms: i64) -> Result<LeaseRow, StoreError> {
        // The playbook's command 3 (holder, far expiry, epoch + 1), plus the expiry the row had,
        // which an update expression cannot copy conditionally: read the row, then write under
        // the condition that it is still what was read (a renewal may move its expiry meanwhile).
        for _ in 0..READ_WRITE_ATTEMPTS {
            let before = self.get(machine).await?;
            let kept = match &before {
                Some(row) if row.holder == QUARANTINED => row.expiry_before_quarantine,
                Some(row) => Some(row.lease_expiry),
                None => Some(0), // nobody held it
            };
            let mut update = self
                .update(machine)
                .expression_attribute_names("#h", "holder")
                .expression_attribute_values(":q", s(QUARANTINED))
                .expression_attribute_values(":far", n(QUARANTINE_EXPIRY_UNIX_MS))
                .expression_attribute_values(":one", n(1));
            update = match kept {
                Some(kept) => update
                    .update_expression(
                        "SET #h = :q, lease_expiry = :far, expiry_before_quarantine = :kept \
                         ADD lease_epoch :one REMOVE claim_token",
                    )
                    .expression_attribute_values(":kept", n(kept)),
                None => update.update_expression(
                    "SET #h = :q, lease_expiry = :far ADD lease_epoch :one REMOVE claim_token, expiry_before_quarantine",
                ),
            };
            update = match &before {
                Some(row) => update
                    .condition_expression(
                        "#h = :was_holder AND lease_epoch = :was_epoch AND lease_expiry = :was_expiry",
                    )
                    .expression_attribute_values(":was_holder", s(row.holder.clone()))
                    .expression_attribute_values(":was_epoch", n(row.lease_epoch))
                    .expression_attribute_values(":was_expiry", n(row.lease_expiry)),
                None => update.condition_expression("attribute_not_exists(machine_id)"),
            };
            // Our own first attempt (its answer lost) looks exactly like this.
            let expected_epoch = before.as_ref().map_or(1, |row| row.lease_epoch + 1);
            let ours = |row: &LeaseRow| {
                row.holder == QUARANTINED && row.lease_epoch == expected_epoch && row.expiry_before_quarantine == kept
            };
            let Some(row) = self.write_row_if(update, "quarantine", ours).await? else {
                continue; // changed between the read and the write: read again
            };
            self.record_or_log(AuditEvent::new(
                AuditKind::Quarantine,
                machine,
                operator,
                row.lease_epoch,
                row.lease_expiry,
                now_unix_ms,
            ))
            .await;
            return Ok(row);
        }
        Err(StoreError::Unavailable(format!(
            "machine {machine}'s row changed under {READ_WRITE_ATTEMPTS} quarantine attempts in a row; try again"
        )))
    }

    async fn release_quarantine(
        &self,
        machine: u32,
        operator: &str,
        lift: Lift,
        now_unix_ms: i64,
    ) -> Result<LiftOutcome, StoreError> {
        let released = format!("released-by:{operator}");
        let min_expiry_unix_ms = lift.min_expiry_unix_ms;
        for _ in 0..READ_WRITE_ATTEMPTS {
            let Some(before) = self.get(machine).await? else {
                return Ok(LiftOutcome::NotQuarantined);
            };
            if before.holder != QUARANTINED {
                return Ok(LiftOutcome::NotQuarantined);
            }
            // A kept expiry of the quarantine's own (a quarantine that kept nothing, quarantined
            // again by a command that copies the expiry it replaces) is no kept expiry either.
            let kept = before.expiry_before_quarantine.filter(|&kept| kept < QUARANTINE_EXPIRY_UNIX_MS);
            if kept.is_none() && !lift.holder_stopped {
                return Ok(LiftOutcome::NoKeptExpiry);
            }
            let expiry = kept.unwrap_or(min_expiry_unix_ms).max(min_expiry_unix_ms);
            let update = self
                .update(machine)
                .update_expression(
                    "SET #h = :released, lease_expiry = :expiry ADD lease_epoch :one REMOVE expiry_before_quarantine",
                )
                .condition_expression("#h = :q AND lease_epoch = :was_epoch")
                .expression_attribute_names("#h", "holder")
                .expression_attribute_values(":released", s(released.clone()))
                .expression_attribute_values(":expiry", n(expiry))
                .expression_attribute_values(":one", n(1))
                .expression_attribute_values(":q", s(QUARANTINED))
                .expression_attribute_values(":was_epoch", n(before.lease_epoch));
            // An SDK retry that met its own applied lift: that is "lifted", not "was not
            // quarantined".
            let ours = |row: &LeaseRow| {
                row.holder == released && row.lease_epoch == before.lease_epoch + 1 && row.lease_expiry == expiry
            };
            let Some(row) = self.write_row_if(update, "release", ours).await? else { continue };
            self.record_or_log(AuditEvent::new(
                AuditKind::ReleaseQuarantine,
                machine,
                operator,
                row.lease_epoch,
                row.lease_expiry,
                now_unix_ms,
            ))
            .await;
            return Ok(LiftOutcome::Lifted(row));
        }
        Err(StoreError::Unavailable(format!(
            "machine {machine}'s row changed under {READ_WRITE_ATTEMPTS} lift attempts in a row; try again"
        )))
    }

    async fn get(&self, machine: u32) -> Result<Option<LeaseRow>, StoreError> {
        self.get_item(i64::from(machine)).await?.as_ref().map(lease_row).transpose()
    }

    async fn list(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let mut rows = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let output = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            // The table's own record (an adoption) is no machine number's row.
            let is_row =
                |item: &&Item| !matches!(item.get("machine_id"), Some(AttributeValue::N(key)) if key.starts_with('-'));
            for item in output.items().iter().filter(is_row) {
                rows.push(lease_row(item)?);
            }
            match output.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        rows.sort_by_key(|row| row.machine_id);
        Ok(rows)
    }

    async fn history(
        &self,
        machine: Option<u32>,
        from_unix_ms: i64,
        to_unix_ms: i64,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        self.read_history(machine, from_unix_ms, to_unix_ms).await
    }
}
