//! Restores and adoptions (`idgen leases adopt`, runbooks/lease-table-restore.md): what
//! DynamoDB says a table was made from, the record of an operator's adoption, and the rows it
//! carries over from the table the fleet used before.
//!
//! Never: lets a restored copy no operator adopted be claimed in; lowers a row's expiry or epoch.

use super::item::{Item, n, number, s, string, unavailable};
use super::{DynamoDbLeaseStore, READ_WRITE_ATTEMPTS, TABLE_RECORD_KEY, Written};
use crate::lease::{AuditEvent, AuditKind, LeaseRow, LeaseStore, QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError};

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
            // Our own first attempt, applied with its answer lost, is seen by the next read.
            if let Written::Applied(_) = self.write_if(update, |_| false).await? {
                return Ok(true);
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
                .expression_attribute_values(":epoch", n(epoch));
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
            let ours = |row: &LeaseRow| {
                row.holder == QUARANTINED && row.lease_epoch == epoch && row.expiry_before_quarantine == kept
            };
            let Some(row) = self.write_row_if(update, "quarantine", ours).await? else { continue };
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
    pub(super) async fn unadopted_restore(
        &self,
        created: i64,
        restored: Option<Restored>,
    ) -> Result<Option<String>, StoreError> {
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
    pub(super) async fn get_item(&self, key: i64) -> Result<Option<Item>, StoreError> {
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
}
