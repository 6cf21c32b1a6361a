//! The tables themselves: created (`idgen leases init`), verified at a worker's start, and
//! described. Never touches a row.

use std::time::Duration;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableDescription,
};

use super::DynamoDbLeaseStore;
use super::item::unavailable;
use crate::lease::StoreError;

/// What `DescribeTable` says of a lease or audit table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableState {
    Missing,
    Creating,
    Active,
}

impl DynamoDbLeaseStore {
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

    /// `DescribeTable` of `name`; `None` if there is no such table.
    /// Whether a table of that name exists (in this client's region and account).
    pub async fn table_exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.describe_table(name).await?.is_some())
    }

    pub(super) async fn describe_table(&self, name: &str) -> Result<Option<TableDescription>, StoreError> {
        match self.client.describe_table().table_name(name).send().await {
            Ok(described) => Ok(Some(
                described.table().cloned().ok_or_else(|| StoreError::Invalid(format!("{name}: no description")))?,
            )),
            Err(SdkError::ServiceError(e)) if e.err().is_resource_not_found_exception() => Ok(None),
            Err(error) => Err(unavailable(error)),
        }
    }
}
