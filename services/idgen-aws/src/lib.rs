//! Where an AWS service idgen calls is and how patient to be with it ([`AwsSettings`], plain
//! settings, usable without the AWS SDK), and the one AWS SDK configuration every client idgen
//! makes is built from ([`sdk_config`], feature `sdk`): the lease store's DynamoDB client in the
//! embeddable generator, the public-ID service's KMS client. Neither service reaches the other's
//! crate for it.

use std::time::Duration;

/// Where an AWS service is and how patient to be with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsSettings {
    pub region: String,
    /// `None` for AWS itself; e.g. `http://127.0.0.1:5000` for a local server of the same
    /// protocol (moto in the tests).
    pub endpoint: Option<String>,
    /// One attempt's limit; the SDK retries up to `max_attempts` within `operation_timeout`.
    pub attempt_timeout: Duration,
    pub operation_timeout: Duration,
    pub max_attempts: u32,
}

impl Default for AwsSettings {
    fn default() -> Self {
        AwsSettings {
            region: "us-east-1".into(),
            endpoint: None,
            attempt_timeout: Duration::from_millis(1_000),
            operation_timeout: Duration::from_millis(3_000),
            max_attempts: 3,
        }
    }
}

impl AwsSettings {
    /// The same place with patient timeouts, for one-off administrative calls (table creation,
    /// a data key made at `init`) that can take far longer than a lease write.
    pub fn patient(&self) -> Self {
        AwsSettings {
            attempt_timeout: self.attempt_timeout.max(Duration::from_secs(10)),
            operation_timeout: self.operation_timeout.max(Duration::from_secs(30)),
            ..self.clone()
        }
    }
}

/// The AWS SDK configuration every idgen service uses: rustls (ring) as the one TLS stack, the
/// standard credential chain (environment, profile, web identity, ECS, EC2 instance metadata;
/// a profile's `credential_process` included, run again when its credentials expire: how a
/// public-ID host hands its service credentials of a role of their own), standard retries with
/// backoff and jitter, and these timeouts.
#[cfg(feature = "sdk")]
pub async fn sdk_config(settings: &AwsSettings) -> aws_config::SdkConfig {
    use aws_config::retry::RetryConfig;
    use aws_config::timeout::TimeoutConfig;
    use aws_config::{BehaviorVersion, Region};
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
    let http =
        aws_smithy_http_client::Builder::new().tls_provider(tls::Provider::Rustls(CryptoMode::Ring)).build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .http_client(http)
        .retry_config(RetryConfig::standard().with_max_attempts(settings.max_attempts))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(settings.attempt_timeout)
                .operation_attempt_timeout(settings.attempt_timeout)
                .operation_timeout(settings.operation_timeout)
                .build(),
        );
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}
