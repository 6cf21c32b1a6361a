//! Where an AWS service (the DynamoDB lease tables, KMS) is and how patient to be with it: plain
//! settings, usable without the AWS SDK compiled in.

use std::time::Duration;

/// Where the tables are and how patient to be with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoDbSettings {
    pub region: String,
    /// `None` for AWS itself; e.g. `http://127.0.0.1:5000` for a local DynamoDB-protocol server.
    pub endpoint: Option<String>,
    /// One attempt's limit; the SDK retries up to `max_attempts` within `operation_timeout`.
    pub attempt_timeout: Duration,
    pub operation_timeout: Duration,
    pub max_attempts: u32,
}

impl Default for DynamoDbSettings {
    fn default() -> Self {
        DynamoDbSettings {
            region: "us-east-1".into(),
            endpoint: None,
            attempt_timeout: Duration::from_millis(1_000),
            operation_timeout: Duration::from_millis(3_000),
            max_attempts: 3,
        }
    }
}

impl DynamoDbSettings {
    /// The same place with patient timeouts, for one-off administrative calls (table creation)
    /// that can take far longer than a lease write.
    pub fn patient(&self) -> Self {
        DynamoDbSettings {
            attempt_timeout: self.attempt_timeout.max(Duration::from_secs(10)),
            operation_timeout: self.operation_timeout.max(Duration::from_secs(30)),
            ..self.clone()
        }
    }
}
