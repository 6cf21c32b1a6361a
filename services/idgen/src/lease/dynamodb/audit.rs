//! The audit table, `<table>-audit`: one record per lease event, written after the event's
//! outcome is decided (to the spool when the table will not take it), and read back by
//! `idgen leases history`. Never decides an outcome.

use async_trait::async_trait;

use super::DynamoDbLeaseStore;
use super::item::{Item, n, number, s, string, unavailable};
use crate::lease::audit_spool::{AuditSink, SpooledRecord};
use crate::lease::{AuditEvent, AuditKind, StoreError};
use crate::metrics::TableLabel;

/// The spool's way to the audit table: the store's own [`DynamoDbLeaseStore::put_audit`] (on a
/// copy without the spool, which would otherwise hold itself).
pub(super) struct AuditTable(pub(super) DynamoDbLeaseStore);

#[async_trait]
impl AuditSink for AuditTable {
    async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError> {
        self.0.put_audit(record).await
    }
}

impl DynamoDbLeaseStore {
    /// Writes one audit item (a record now, or a spooled one replayed). Never over another: the
    /// put is refused where the key exists (a record is never rewritten, by this process or by
    /// anyone holding its role's `PutItem`), and a replayed record found already there (it was
    /// written before the answer was lost) is done.
    pub(super) async fn put_audit(&self, record: &SpooledRecord) -> Result<(), StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.audit)
            .item("machine_id", n(record.machine_id))
            .item("event_key", s(&record.event_key))
            .item("event", s(&record.event))
            .item("holder", s(&record.holder))
            .item("lease_epoch", n(record.lease_epoch))
            .item("lease_expiry", n(record.lease_expiry))
            .item("at_unix_ms", n(record.at_unix_ms))
            .condition_expression("attribute_not_exists(event_key)")
            .send()
            .await;
        match put {
            Ok(_) => Ok(()),
            Err(aws_sdk_dynamodb::error::SdkError::ServiceError(e))
                if e.err().is_conditional_check_failed_exception() =>
            {
                tracing::debug!(key = %record.event_key, table = %self.audit, "audit record already written");
                Ok(())
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// Records an event whose outcome is already decided (a change applied, or a renewal
    /// refused): a record the table will not take must not turn that outcome into an error the
    /// keeper would act on. It goes to the spool instead (straight away while earlier ones wait
    /// there, so an outage costs one timeout, not one per record); only without a spool, or
    /// when the spool cannot be written either, is it lost, and then logged loudly.
    pub(super) async fn record_or_log(&self, event: AuditEvent) {
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

    /// [`LeaseStore::history`](crate::lease::LeaseStore::history): the audit table's records of one
    /// machine number (a Query of its key) or of all (a Scan), oldest first.
    pub(super) async fn read_history(
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
