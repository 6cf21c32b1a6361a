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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableDescription,
};

use crate::lease::audit_spool::{AuditSink, AuditSpool, SpooledRecord};
use crate::lease::genesis::{self, Genesis, GenesisHow, GenesisRequest, GenesisWrite};
use crate::lease::{
    AuditEvent, AuditKind, ClaimOutcome, ClaimToken, Conditional, LeaseRow, LeaseStore, Lift, LiftOutcome,
    QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError,
};
use crate::metrics::TableLabel;
pub use idgen_aws::AwsSettings as DynamoDbSettings;

type Item = HashMap<String, AttributeValue>;

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

/// The spool's way to the audit table: the store's own [`DynamoDbLeaseStore::put_audit`] (on a
/// copy without the spool, which would otherwise hold itself).
struct AuditTable(DynamoDbLeaseStore);

#[async_trait]
impl AuditSink for AuditTable {
    async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError> {
        self.0.put_audit(record).await
    }
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn unavailable<E, R>(error: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let detail = match &error {
        SdkError::ServiceError(service) => {
            let e = service.err();
            format!("{}: {}", e.code().unwrap_or("service error"), e.message().unwrap_or(""))
        }
        other => format!("{other}: {}", std::error::Error::source(other).map(|s| s.to_string()).unwrap_or_default()),
    };
    StoreError::Unavailable(detail)
}

fn number<T: std::str::FromStr>(item: &Item, name: &str) -> Result<T, StoreError> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().map_err(|_| StoreError::Invalid(format!("{name} = {text}"))),
        other => Err(StoreError::Invalid(format!("{name} missing or not a number: {other:?}"))),
    }
}

fn string(item: &Item, name: &str) -> Result<String, StoreError> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Ok(text.clone()),
        other => Err(StoreError::Invalid(format!("{name} missing or not a string: {other:?}"))),
    }
}

fn lease_row(item: &Item) -> Result<LeaseRow, StoreError> {
    Ok(LeaseRow {
        machine_id: number(item, "machine_id")?,
        holder: string(item, "holder")?,
        lease_expiry: number(item, "lease_expiry")?,
        lease_epoch: number(item, "lease_epoch")?,
        claim_token: item.contains_key("claim_token").then(|| string(item, "claim_token")).transpose()?,
        expiry_before_quarantine: item
            .contains_key("expiry_before_quarantine")
            .then(|| number(item, "expiry_before_quarantine"))
            .transpose()?,
    })
}

/// The row as it was, which `ReturnValuesOnConditionCheckFailure = ALL_OLD` returns with a failed condition.
fn old_item(error: &aws_sdk_dynamodb::operation::update_item::UpdateItemError) -> Option<&Item> {
    match error {
        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed) => {
            failed.item()
        }
        _ => None,
    }
}

/// What `DescribeTable` says of a lease or audit table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableState {
    Missing,
    Creating,
    Active,
}

/// The row as it was before a failed condition, when `ours` says it already holds what we meant
/// to write: a retry that met its own first attempt.
fn already_ours(old: Option<&Item>, ours: impl FnOnce(&LeaseRow) -> bool) -> Option<LeaseRow> {
    lease_row(old?).ok().filter(ours)
}

/// How often a read-then-write (quarantine, lift) is tried again when the row changed between
/// the read and the conditional write.
const READ_WRITE_ATTEMPTS: usize = 5;

/// The key of the lease table's own record (an adoption, `idgen leases adopt`): a number no
/// machine can have, so no claim touches it; [`LeaseStore::list`] leaves it out.
pub const TABLE_RECORD_KEY: i64 = -1;

/// The key of the table's genesis ([`crate::lease::genesis`]), likewise no machine's.
pub const GENESIS_KEY: i64 = -2;

/// What `DescribeTable` says of a table made by a restore (point in time, or from a backup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// `RestoreSummary.SourceTableArn`, else the backup's ARN.
    pub source: String,
    /// The name of the table it is a copy of (from `SourceTableArn`), when DynamoDB says.
    pub source_table: Option<String>,
    /// The point in time the copy holds, Unix ms.
    pub restored_to_unix_ms: i64,
}

/// The table name in a DynamoDB table ARN (`arn:aws:dynamodb:<region>:<account>:table/<name>`, a
/// backup's ARN continuing `/backup/<id>`).
pub fn table_of_arn(arn: &str) -> Option<&str> {
    let (_, rest) = arn.split_once(":table/")?;
    rest.split('/').next().filter(|name| !name.is_empty())
}

/// An operator's statement, kept in the table, that its numbers' earlier holders are all past
/// their fences and can renew nowhere ([`DynamoDbLeaseStore::record_adoption`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The table's creation time the adoption is for ([`DynamoDbLeaseStore::origin`]): a copy
    /// of an adopted table (the record restored with the rows) is not adopted itself.
    pub table_created_unix_ms: i64,
    /// The table the fleet used before (its name), or `gone`.
    pub source: String,
    pub operator: String,
    pub at_unix_ms: i64,
}

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
    fn update(&self, machine: u32) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("machine_id", n(machine))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }

    pub fn audit_table(&self) -> &str {
        &self.audit
    }

    /// The table's creation time (Unix ms) and, if a restore made it, what it was restored from.
    pub async fn origin(&self) -> Result<(i64, Option<Restored>), StoreError> {
        let Some(table) = self.describe_table(&self.table).await? else {
            return Err(StoreError::Misconfigured(format!("table {} does not exist", self.table)));
        };
        let millis = |at: Option<&aws_sdk_dynamodb::primitives::DateTime>| at.and_then(|at| at.to_millis().ok());
        let created = millis(table.creation_date_time()).unwrap_or(0);
        let restored = table.restore_summary().map(|summary| Restored {
            source: summary
                .source_table_arn()
                .or(summary.source_backup_arn())
                .unwrap_or("an unnamed source")
                .to_owned(),
            source_table: summary.source_table_arn().and_then(table_of_arn).map(str::to_owned),
            restored_to_unix_ms: millis(Some(summary.restore_date_time())).unwrap_or(0),
        });
        Ok((created, restored))
    }

    /// Raises one row to the expiry a holder in the table the fleet used before could still be
    /// issuing under (`idgen leases adopt`): holder `holder`, an epoch above both tables' and
    /// `expiry`, unless the row's own expiry is that late already. Nobody claims the number here
    /// before a claim could have taken it there. Returns whether it wrote.
    pub async fn carry_expiry(
        &self,
        machine: u32,
        holder: &str,
        expiry: i64,
        old_epoch: u64,
    ) -> Result<bool, StoreError> {
        for _ in 0..READ_WRITE_ATTEMPTS {
            let before = self.get(machine).await?;
            if before.as_ref().is_some_and(|row| row.lease_expiry >= expiry) {
                return Ok(false);
            }
            let epoch = before.as_ref().map_or(0, |row| row.lease_epoch).max(old_epoch) + 1;
            let update = self
                .update(machine)
                .update_expression("SET #h = :h, lease_expiry = :e, lease_epoch = :epoch REMOVE claim_token")
                .expression_attribute_names("#h", "holder")
                .expression_attribute_values(":h", s(holder))
                .expression_attribute_values(":e", n(expiry))
                .expression_attribute_values(":epoch", n(epoch));
            let update = match &before {
                Some(row) => update
                    .condition_expression("lease_epoch = :was_epoch AND lease_expiry = :was_expiry")
                    .expression_attribute_values(":was_epoch", n(row.lease_epoch))
                    .expression_attribute_values(":was_expiry", n(row.lease_expiry)),
                None => update.condition_expression("attribute_not_exists(machine_id)"),
            };
            match update.send().await {
                Ok(_) => return Ok(true),
                Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => continue,
                Err(error) => return Err(unavailable(error)),
            }
        }
        Err(StoreError::Unavailable(format!("machine {machine}'s row kept changing while its expiry was carried")))
    }

    /// Quarantines one row as the table the fleet used before had it quarantined
    /// (`idgen leases adopt`): keeping exactly what that quarantine kept, `kept` (`None`: it kept
    /// nothing, and its lift must wait for the holder to be stopped here too), or, where this
    /// table's row held a later expiry than the kept one, that. The epoch goes above both tables'.
    pub async fn carry_quarantine(
        &self,
        machine: u32,
        operator: &str,
        kept: Option<i64>,
        old_epoch: u64,
        now_unix_ms: i64,
    ) -> Result<LeaseRow, StoreError> {
        for _ in 0..READ_WRITE_ATTEMPTS {
            let before = self.get(machine).await?;
            let epoch = before.as_ref().map_or(0, |row| row.lease_epoch).max(old_epoch) + 1;
            // This table's own row is a holder's too (a restored copy's, or a carried expiry): the
            // later of the two, where both say something.
            let own = before.as_ref().filter(|row| row.holder != QUARANTINED).map(|row| row.lease_expiry);
            let kept = kept.map(|kept| own.map_or(kept, |own| own.max(kept)));
            let update = self
                .update(machine)
                .expression_attribute_names("#h", "holder")
                .expression_attribute_values(":q", s(QUARANTINED))
                .expression_attribute_values(":far", n(QUARANTINE_EXPIRY_UNIX_MS))
                .expression_attribute_values(":epoch", n(epoch))
                .return_values(ReturnValue::AllNew);
            let update = match kept {
                Some(kept) => update
                    .update_expression(
                        "SET #h = :q, lease_expiry = :far, lease_epoch = :epoch, expiry_before_quarantine = :kept \
                         REMOVE claim_token",
                    )
                    .expression_attribute_values(":kept", n(kept)),
                None => update.update_expression(
                    "SET #h = :q, lease_expiry = :far, lease_epoch = :epoch REMOVE claim_token, expiry_before_quarantine",
                ),
            };
            let update = match &before {
                Some(row) => update
                    .condition_expression("lease_epoch = :was_epoch AND lease_expiry = :was_expiry")
                    .expression_attribute_values(":was_epoch", n(row.lease_epoch))
                    .expression_attribute_values(":was_expiry", n(row.lease_expiry)),
                None => update.condition_expression("attribute_not_exists(machine_id)"),
            };
            let row = match update.send().await {
                Ok(output) => lease_row(
                    output.attributes().ok_or_else(|| StoreError::Invalid("quarantine returned no row".into()))?,
                )?,
                Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                    match already_ours(old_item(e.err()), |row| {
                        row.holder == QUARANTINED && row.lease_epoch == epoch && row.expiry_before_quarantine == kept
                    }) {
                        Some(row) => row,
                        None => continue,
                    }
                }
                Err(error) => return Err(unavailable(error)),
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
            "machine {machine}'s row kept changing while its quarantine was carried over"
        )))
    }

    /// The adoption recorded in this table, if any.
    pub async fn adoption(&self) -> Result<Option<Adoption>, StoreError> {
        let Some(item) = self.get_item(TABLE_RECORD_KEY).await? else { return Ok(None) };
        Ok(Some(Adoption {
            table_created_unix_ms: number(&item, "table_created_unix_ms")?,
            source: string(&item, "adopted_from")?,
            operator: string(&item, "adopted_by")?,
            at_unix_ms: number(&item, "adopted_at_unix_ms")?,
        }))
    }

    /// Whether this table is a restored copy no operator has adopted: why not to claim in it.
    async fn unadopted_restore(&self, created: i64, restored: Option<Restored>) -> Result<Option<String>, StoreError> {
        let Some(restored) = restored else { return Ok(None) };
        if self.adoption().await?.is_some_and(|adoption| adoption.table_created_unix_ms == created) {
            return Ok(None);
        }
        Ok(Some(format!(
            "lease table {} is a restored copy of {} as of {} that no operator has adopted: its rows are older \
             than the leases their numbers' holders may still hold, so a claim here could take a number that is \
             in use. Nothing is claimed in it until `idgen leases adopt` has run (runbooks/lease-table-restore.md)",
            self.table,
            restored.source,
            idgen_core::format_unix_ms(restored.restored_to_unix_ms),
        )))
    }

    /// One item of the lease table, by key (a machine number, or [`TABLE_RECORD_KEY`]).
    async fn get_item(&self, key: i64) -> Result<Option<Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("machine_id", n(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output.item().cloned())
    }

    /// `DescribeTable` of `name`; `None` if there is no such table.
    async fn describe_table(&self, name: &str) -> Result<Option<TableDescription>, StoreError> {
        match self.client.describe_table().table_name(name).send().await {
            Ok(described) => Ok(Some(
                described.table().cloned().ok_or_else(|| StoreError::Invalid(format!("{name}: no description")))?,
            )),
            Err(SdkError::ServiceError(e)) if e.err().is_resource_not_found_exception() => Ok(None),
            Err(error) => Err(unavailable(error)),
        }
    }

    /// Records that an operator adopted this table: its numbers' earlier holders (in `source`,
    /// the table the fleet used before) are stopped or quarantined and past their fences. Only
    /// `idgen leases adopt` calls this, after making it so.
    pub async fn record_adoption(
        &self,
        source: &str,
        operator: &str,
        now_unix_ms: i64,
    ) -> Result<Adoption, StoreError> {
        let (created, _) = self.origin().await?;
        self.client
            .update_item()
            .table_name(&self.table)
            .key("machine_id", n(TABLE_RECORD_KEY))
            .update_expression(
                "SET table_created_unix_ms = :c, adopted_from = :f, adopted_by = :o, adopted_at_unix_ms = :t",
            )
            .expression_attribute_values(":c", n(created))
            .expression_attribute_values(":f", s(source))
            .expression_attribute_values(":o", s(operator))
            .expression_attribute_values(":t", n(now_unix_ms))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(Adoption {
            table_created_unix_ms: created,
            source: source.to_owned(),
            operator: operator.to_owned(),
            at_unix_ms: now_unix_ms,
        })
    }

    /// Creates the lease table and its audit table if they do not exist (on-demand capacity).
    /// Idempotent: an existing table with the right key schema is left as it is; one with a
    /// different key schema is an error.
    pub async fn create_tables(&self) -> Result<(), StoreError> {
        self.create_table(&self.table, &[("machine_id", ScalarAttributeType::N, KeyType::Hash)]).await?;
        self.create_table(
            &self.audit,
            &[
                ("machine_id", ScalarAttributeType::N, KeyType::Hash),
                ("event_key", ScalarAttributeType::S, KeyType::Range),
            ],
        )
        .await
    }

    async fn create_table(&self, name: &str, keys: &[(&str, ScalarAttributeType, KeyType)]) -> Result<(), StoreError> {
        let mut request = self.client.create_table().table_name(name).billing_mode(BillingMode::PayPerRequest);
        for (attribute, kind, key) in keys {
            request = request
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(*attribute)
                        .attribute_type(kind.clone())
                        .build()
                        .map_err(|e| StoreError::Invalid(e.to_string()))?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(*attribute)
                        .key_type(key.clone())
                        .build()
                        .map_err(|e| StoreError::Invalid(e.to_string()))?,
                );
        }
        match request.send().await {
            Ok(_) => {}
            Err(SdkError::ServiceError(e)) if e.err().is_resource_in_use_exception() => {}
            Err(error) => return Err(unavailable(error)),
        }
        // Wait until ACTIVE (immediate on local servers; seconds on AWS, where DescribeTable may
        // not find a table that was just created).
        for _ in 0..120 {
            if self.table_state(name, keys).await? == TableState::Active {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(StoreError::Unavailable(format!("table {name} did not become ACTIVE within a minute")))
    }

    /// Checks that the lease table exists with the key schema SPEC §2 gives, so that a mistyped
    /// table or region fails a worker's start instead of leaving it not-ready with only
    /// warnings. A table that cannot be reached is `Unavailable`, not misconfigured.
    pub async fn verify_lease_table(&self) -> Result<(), StoreError> {
        self.verify(&self.table, &[("machine_id", ScalarAttributeType::N, KeyType::Hash)]).await
    }

    /// [`Self::verify_lease_table`] for the audit table.
    pub async fn verify_audit_table(&self) -> Result<(), StoreError> {
        let keys = [
            ("machine_id", ScalarAttributeType::N, KeyType::Hash),
            ("event_key", ScalarAttributeType::S, KeyType::Range),
        ];
        self.verify(&self.audit, &keys).await
    }

    async fn verify(&self, name: &str, keys: &[(&str, ScalarAttributeType, KeyType)]) -> Result<(), StoreError> {
        if self.table_state(name, keys).await? == TableState::Missing {
            return Err(StoreError::Misconfigured(format!(
                "table {name} does not exist (create it with `idgen leases init`)"
            )));
        }
        Ok(())
    }

    /// Whether the table exists and is ACTIVE; a table with other keys is `Misconfigured`.
    async fn table_state(
        &self,
        name: &str,
        keys: &[(&str, ScalarAttributeType, KeyType)],
    ) -> Result<TableState, StoreError> {
        let Some(table) = self.describe_table(name).await? else { return Ok(TableState::Missing) };
        let schema: Vec<(String, KeyType)> =
            table.key_schema().iter().map(|k| (k.attribute_name().to_owned(), k.key_type().clone())).collect();
        let wanted: Vec<(String, KeyType)> = keys.iter().map(|(a, _, k)| ((*a).to_owned(), k.clone())).collect();
        if schema != wanted {
            return Err(StoreError::Misconfigured(format!(
                "table {name} exists with key schema {schema:?}, expected {wanted:?}"
            )));
        }
        Ok(if table.table_status().is_some_and(|s| s.as_str() == "ACTIVE") {
            TableState::Active
        } else {
            TableState::Creating
        })
    }

    /// Writes one audit item (a record now, or a spooled one replayed).
    async fn put_audit(&self, record: &SpooledRecord) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.audit)
            .item("machine_id", n(record.machine_id))
            .item("event_key", s(&record.event_key))
            .item("event", s(&record.event))
            .item("holder", s(&record.holder))
            .item("lease_epoch", n(record.lease_epoch))
            .item("lease_expiry", n(record.lease_expiry))
            .item("at_unix_ms", n(record.at_unix_ms))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Records an event whose outcome is already decided (a change applied, or a renewal
    /// refused): a record the table will not take must not turn that outcome into an error the
    /// keeper would act on. It goes to the spool instead (straight away while earlier ones wait
    /// there, so an outage costs one timeout, not one per record); only without a spool, or
    /// when the spool cannot be written either, is it lost, and then logged loudly.
    async fn record_or_log(&self, event: AuditEvent) {
        let record = SpooledRecord {
            machine_id: event.machine_id,
            event_key: format!(
                "{:020}#{}#{:016x}",
                event.at_unix_ms.max(0),
                event.kind.as_str(),
                rand::random::<u64>()
            ),
            event: event.kind.as_str().to_owned(),
            holder: event.holder,
            lease_epoch: event.lease_epoch,
            lease_expiry: event.lease_expiry,
            at_unix_ms: event.at_unix_ms,
        };
        let what = format!("{} of machine {} by {}", record.event, record.machine_id, record.holder);
        let error = match &self.spool {
            Some(spool) if spool.waiting() > 0 => "earlier records are still waiting in the spool".to_owned(),
            _ => match self.put_audit(&record).await {
                Ok(()) => return,
                Err(error) => error.to_string(),
            },
        };
        let why = match &self.spool {
            None => "no spool configured".to_owned(),
            Some(spool) => match spool.append(&record) {
                Ok(()) => {
                    tracing::warn!(%error, table = %self.audit, spool = %spool.dir().display(), "audit record spooled: {what}");
                    return;
                }
                Err(spool_error) => format!("the spool failed too: {spool_error}"),
            },
        };
        crate::metrics::audit_spool().lost.get_or_create(&TableLabel { table: self.audit.clone() }).inc();
        tracing::error!(%error, table = %self.audit, "audit record lost ({why}): {what}");
    }
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
            match update.update_expression(expression).send().await {
                Ok(_) => return Ok(new),
                Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => continue,
                Err(error) => return Err(unavailable(error)),
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
        let result = self
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
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        let row = match result {
            Ok(output) => {
                lease_row(output.attributes().ok_or_else(|| StoreError::Invalid("claim returned no row".into()))?)?
            }
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                // Our own earlier attempt (an SDK retry, or the keeper's after a lost answer) is
                // the one row carrying our token. Its audit record may never have been written;
                // one more, with the same values, is better than none.
                match already_ours(old_item(e.err()), |row| row.claimed_by(holder, token)) {
                    Some(row) => row,
                    None => return Ok(ClaimOutcome::Taken),
                }
            }
            Err(error) => return Err(unavailable(error)),
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
        now_unix_ms: i64,
    ) -> Result<Conditional, StoreError> {
        let result = self
            .update(machine)
            .update_expression("SET lease_expiry = :new_expiry")
            .condition_expression("holder = :me AND lease_epoch = :my_epoch AND lease_expiry < :new_expiry")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":my_epoch", n(epoch))
            .expression_attribute_values(":new_expiry", n(new_expiry_unix_ms))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Conditional::Applied),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                let old = old_item(e.err());
                if already_ours(old, |row| row.renewed_by(holder, epoch, new_expiry_unix_ms)).is_some() {
                    return Ok(Conditional::Applied);
                }
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
            Err(error) => Err(unavailable(error)),
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
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("machine_id", n(machine))
            .update_expression("SET lease_expiry = :expiry")
            .condition_expression("holder = :me AND lease_epoch = :my_epoch")
            .expression_attribute_values(":me", s(holder))
            .expression_attribute_values(":my_epoch", n(epoch))
            .expression_attribute_values(":expiry", n(expiry_unix_ms))
            .send()
            .await;
        match result {
            Ok(_) => {}
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                return Ok(Conditional::ConditionFailed);
            }
            Err(error) => return Err(unavailable(error)),
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
                .expression_attribute_values(":one", n(1))
                .return_values(ReturnValue::AllNew);
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
            let row = match update.send().await {
                Ok(output) => lease_row(
                    output.attributes().ok_or_else(|| StoreError::Invalid("quarantine returned no row".into()))?,
                )?,
                Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                    // Our own first attempt (its answer lost) looks exactly like this.
                    let expected_epoch = before.as_ref().map_or(1, |row| row.lease_epoch + 1);
                    match already_ours(old_item(e.err()), |row| {
                        row.holder == QUARANTINED
                            && row.lease_epoch == expected_epoch
                            && row.expiry_before_quarantine == kept
                    }) {
                        Some(row) => row,
                        None => continue, // changed between the read and the write: read again
                    }
                }
                Err(error) => return Err(unavailable(error)),
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
            let result = self
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
                .expression_attribute_values(":was_epoch", n(before.lease_epoch))
                .return_values(ReturnValue::AllNew)
                .send()
                .await;
            let row = match result {
                Ok(output) => lease_row(
                    output.attributes().ok_or_else(|| StoreError::Invalid("release returned no row".into()))?,
                )?,
                Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                    // An SDK retry that met its own applied lift: that is "lifted", not "was not
                    // quarantined".
                    match already_ours(old_item(e.err()), |row| {
                        row.holder == released
                            && row.lease_epoch == before.lease_epoch + 1
                            && row.lease_expiry == expiry
                    }) {
                        Some(row) => row,
                        None => continue,
                    }
                }
                Err(error) => return Err(unavailable(error)),
            };
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
        let mut events = Vec::new();
        let mut start: Option<Item> = None;
        let (from, to) = (from_unix_ms.max(0), to_unix_ms.max(0));
        loop {
            let (items, last) = match machine {
                Some(machine) => {
                    let output = self
                        .client
                        .query()
                        .table_name(&self.audit)
                        .key_condition_expression("machine_id = :m AND event_key BETWEEN :from AND :to")
                        .expression_attribute_values(":m", n(machine))
                        .expression_attribute_values(":from", s(format!("{from:020}")))
                        .expression_attribute_values(":to", s(format!("{to:020}~")))
                        .consistent_read(true)
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .map_err(unavailable)?;
                    (output.items().to_vec(), output.last_evaluated_key().cloned())
                }
                None => {
                    let output = self
                        .client
                        .scan()
                        .table_name(&self.audit)
                        .filter_expression("at_unix_ms BETWEEN :from AND :to")
                        .expression_attribute_values(":from", n(from))
                        .expression_attribute_values(":to", n(to))
                        .consistent_read(true)
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .map_err(unavailable)?;
                    (output.items().to_vec(), output.last_evaluated_key().cloned())
                }
            };
            for item in &items {
                let kind = string(item, "event")?;
                events.push((
                    string(item, "event_key")?,
                    AuditEvent {
                        machine_id: number(item, "machine_id")?,
                        kind: AuditKind::parse(&kind)
                            .ok_or_else(|| StoreError::Invalid(format!("audit event {kind:?}")))?,
                        holder: string(item, "holder")?,
                        lease_epoch: number(item, "lease_epoch")?,
                        lease_expiry: number(item, "lease_expiry")?,
                        at_unix_ms: number(item, "at_unix_ms")?,
                    },
                ));
            }
            match last {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        // Oldest first; within a millisecond, by event key (stable, not necessarily write order).
        events.sort_by(|a, b| (a.1.at_unix_ms, &a.0).cmp(&(b.1.at_unix_ms, &b.0)));
        Ok(events.into_iter().map(|(_, event)| event).collect())
    }
}
