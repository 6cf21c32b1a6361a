//! The wrapped data keys: read at start-up, a version added by `rotate-key`, re-wrapped under
//! the encryption context by `init`. Only their KMS-wrapped form is ever stored.
//!
//! Never: stores a key unwrapped, or replaces a version that was wrapped under the context.

use idgen_server::database::is_unique_violation;
use idgen_server::on_pool;

use super::PublicIdStore;

impl PublicIdStore {
    /// Wrapped data keys by version, oldest first.
    pub async fn wrapped_keys(&self) -> Result<Vec<WrappedKey>, sqlx::Error> {
        let sql = "SELECT version, kms_key_id, wrapped_key, encryption_context FROM public_id_keys ORDER BY version";
        let rows: Result<Vec<KeyRow>, sqlx::Error> =
            on_pool!(&self.pool, |pool| sqlx::query_as(sql).fetch_all(pool).await);
        let rows = self.counted("read_keys", rows)?;
        Ok(rows
            .into_iter()
            .map(|(version, kms_key_id, wrapped, context)| WrappedKey {
                version: version as u8,
                kms_key_id,
                wrapped,
                with_context: context != 0,
            })
            .collect())
    }

    /// Stores a wrapped key (made with the encryption context) as the next version. `false` if
    /// another instance took that version.
    pub async fn add_wrapped_key(
        &self,
        version: u8,
        kms_key_id: &str,
        wrapped: &[u8],
        now_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = "INSERT INTO public_id_keys (version, kms_key_id, wrapped_key, created_at_ms, encryption_context) \
                   VALUES ($1, $2, $3, $4, 1)";
        let inserted = on_pool!(&self.pool, |pool| {
            sqlx::query(sql)
                .bind(i64::from(version))
                .bind(kms_key_id)
                .bind(wrapped)
                .bind(now_ms)
                .execute(pool)
                .await
                .map(|_| ())
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(error) if is_unique_violation(&error) => Ok(false),
            Err(error) => self.counted("add_key", Err(error)),
        }
    }

    /// Replaces a version's wrapped form by one made under the encryption context (by `kms_key_id`),
    /// where the stored one was made without.
    pub async fn rewrap(&self, version: u8, kms_key_id: &str, wrapped: &[u8]) -> Result<(), sqlx::Error> {
        let sql = "UPDATE public_id_keys SET wrapped_key = $1, kms_key_id = $2, encryption_context = 1 \
                   WHERE version = $3 AND encryption_context = 0";
        on_pool!(&self.pool, |pool| {
            sqlx::query(sql).bind(wrapped).bind(kms_key_id).bind(i64::from(version)).execute(pool).await.map(|_| ())
        })?;
        Ok(())
    }
}

/// A row of `public_id_keys`: version, KMS key, wrapped key, whether under the encryption context.
type KeyRow = (i64, String, Vec<u8>, i64);

/// One data-key version as stored: only its KMS-wrapped form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedKey {
    pub version: u8,
    /// The KMS key it is wrapped under.
    pub kms_key_id: String,
    pub wrapped: Vec<u8>,
    /// Wrapped under the encryption context ([`crate::kms::encryption_context`]); false only for
    /// a version made before it was used, until `idgen public init` re-wraps it.
    pub with_context: bool,
}
