//! Lease rows as DynamoDB items, and the SDK's errors as the store's: the only place that knows
//! an item's attribute types. Nothing here sends a request.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;

use crate::lease::{LeaseRow, StoreError};

/// One DynamoDB item, by attribute name.
pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(super) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

pub(super) fn unavailable<E, R>(error: SdkError<E, R>) -> StoreError
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

pub(super) fn number<T: std::str::FromStr>(item: &Item, name: &str) -> Result<T, StoreError> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().map_err(|_| StoreError::Invalid(format!("{name} = {text}"))),
        other => Err(StoreError::Invalid(format!("{name} missing or not a number: {other:?}"))),
    }
}

pub(super) fn string(item: &Item, name: &str) -> Result<String, StoreError> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Ok(text.clone()),
        other => Err(StoreError::Invalid(format!("{name} missing or not a string: {other:?}"))),
    }
}

pub(super) fn lease_row(item: &Item) -> Result<LeaseRow, StoreError> {
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
pub(super) fn old_item(error: &aws_sdk_dynamodb::operation::update_item::UpdateItemError) -> Option<&Item> {
    match error {
        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(failed) => {
            failed.item()
        }
        _ => None,
    }
}

/// The row as it was before a failed condition, when `ours` says it already holds what we meant
/// to write: a retry that met its own first attempt.
pub(super) fn already_ours(old: Option<&Item>, ours: impl FnOnce(&LeaseRow) -> bool) -> Option<LeaseRow> {
    lease_row(old?).ok().filter(ours)
}
