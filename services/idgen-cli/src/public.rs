//! `idgen public …`: run the public-ID service, create and resolve public IDs over its API, and
//! add a data-key version for the encrypted format.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::{Value, json};

#[derive(Subcommand, Debug)]
pub enum PublicCommand {
    /// Run the public-ID service (the same as the `idgen-public-ids` binary).
    Serve {
        #[command(flatten)]
        service: idgen_server::ServiceArgs,
    },
    /// Make the configured database the service's (its migrations) and, with a [kms] key and the
    /// encrypted format offered, data key version 1. Run once for a new service, and again after
    /// an upgrade (it applies new migrations). Idempotent; a production service never does this
    /// itself.
    Init {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// PostgreSQL, after an upgrade to 16-byte mappings: check that every mapping of the table
    /// from before (public_ids) was copied by `init`, and drop it, its triggers and functions.
    /// Run it once no instance of the previous version is left (they would fail from then on);
    /// refused, dropping nothing, while any mapping lacks its copy.
    DropLegacyTable {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// Seal the filter of opaque public IDs made before check keys: every untagged one in the
    /// database goes into a Bloom filter, and from then on an untagged public ID outside it is
    /// answered 404 without a database read. Run it once no instance of the previous version runs
    /// (they make untagged IDs, which would no longer resolve on this version's instances); the
    /// instances take it up within 30 s. Run again at any time: it rebuilds the filter.
    SealLegacy {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// Add a check key version: new opaque public IDs carry its tag two minutes from now (by
    /// then every instance has loaded it; they reload every 30 s), and every older version still
    /// checks.
    RotateCheckKey {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// Retire a check key version (a leaked one): refused for the newest (rotate first), for one
    /// new IDs may still be made under, and for one public IDs were made under unless --force,
    /// which puts those IDs into the legacy filter (they keep resolving; a forged ID then passes
    /// the check one time in 2,048). The instances drop it within 30 s.
    RetireCheckKey {
        #[arg(long)]
        config: Option<PathBuf>,
        /// The version to retire (`rotate-check-key` printed it).
        #[arg(long)]
        version: u8,
        /// Retire it although public IDs were made under it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
    /// The public ID of an internal ID (created if it has none in that format).
    Create {
        internal_id: String,
        /// opaque (the default), uuidv7 or encrypted; with --type, the type's own.
        #[arg(long)]
        format: Option<String>,
        /// A type the service configures ([types]): the public ID is then `TYPE_…`.
        #[arg(long = "type")]
        public_type: Option<String>,
        #[arg(long, env = "IDGEN_PUBLIC_IDS_URL", default_value = "http://127.0.0.1:8709")]
        url: String,
        #[arg(long)]
        json: bool,
    },
    /// The internal ID behind a public ID.
    Resolve {
        public_id: String,
        #[arg(long, env = "IDGEN_PUBLIC_IDS_URL", default_value = "http://127.0.0.1:8709")]
        url: String,
        #[arg(long)]
        json: bool,
    },
    /// Add a data-key version (KMS GenerateDataKey): new encrypted IDs use it, old ones still
    /// resolve. Restart the service to load it.
    RotateKey {
        #[arg(long)]
        config: Option<PathBuf>,
        /// The role that may write data keys (the schema's owner), where the service's may not.
        #[command(flatten)]
        owner: crate::OwnerUrl,
        #[arg(long)]
        json: bool,
    },
}

async fn call(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let response = request.send().await.context("reaching the public-ID service")?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("{status}: {}", body["error"]["message"].as_str().unwrap_or("(no message)"));
    }
    Ok(body)
}

pub async fn run(command: PublicCommand, tls: &crate::tls::ClientTls) -> anyhow::Result<()> {
    let http = tls.client()?;
    match command {
        PublicCommand::Serve { service } => {
            service
                .serve(|config, file| idgen_public_ids::serve(config, file, idgen_server::cli::shutdown_signal()))
                .await
        }
        PublicCommand::Create { internal_id, format, public_type, url, json } => {
            let mut body = json!({"internal_id": internal_id});
            if let Some(format) = format {
                body["format"] = json!(format);
            }
            if let Some(public_type) = public_type {
                body["type"] = json!(public_type);
            }
            let answer = call(http.post(format!("{}/v1/public-ids", url.trim_end_matches('/'))).json(&body)).await?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", answer["public_id"].as_str().unwrap_or(""));
            }
            Ok(())
        }
        PublicCommand::Resolve { public_id, url, json } => {
            let answer = call(http.get(format!("{}/v1/public-ids/{public_id}", url.trim_end_matches('/')))).await?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", answer["internal_id"].as_str().unwrap_or(""));
            }
            Ok(())
        }
        PublicCommand::Init { config: file, owner, json } => {
            let config = idgen_public_ids::PublicIdsConfig::load(file.as_deref())?;
            let done = idgen_public_ids::init(&config, owner.url.as_deref(), owner.runtime_password.as_deref()).await?;
            let (key, copied) = (done.key_version_made, done.copied);
            let database = idgen::config::redacted_url(config.database_url());
            if json {
                let copied = copied.map(|c| json!({"opaque": c.opaque, "uuidv7": c.uuidv7}));
                println!("{}", json!({"database": database, "key_version_made": key, "legacy_copied": copied}));
            } else {
                println!("{database}: the public-ID service's tables are in place (migrations up to date)");
                if let Some(copied) = copied {
                    println!(
                        "copied the mappings made before 16-byte storage: {} opaque, {} UUIDv7; once no instance of \
                         the previous version runs: idgen public drop-legacy-table",
                        copied.opaque, copied.uuidv7
                    );
                }
                match (key, &config.kms) {
                    (Some(version), Some(kms)) => {
                        println!("data key version {version} made under KMS key {}", kms.key_id)
                    }
                    (None, Some(_)) => println!("a data key is already stored: none made"),
                    (_, None) => println!("no [kms] key configured: no data key made (the encrypted format is off)"),
                }
            }
            Ok(())
        }
        PublicCommand::DropLegacyTable { config, owner, json } => {
            let config = idgen_public_ids::PublicIdsConfig::load(config.as_deref())?;
            let dropped = idgen_public_ids::drop_legacy_table(&config, owner.url.as_deref()).await?;
            let rows = match dropped {
                idgen_public_ids::store::legacy::Dropped::Dropped { rows } => Some(rows),
                idgen_public_ids::store::legacy::Dropped::NothingToDrop => None,
            };
            match (json, rows) {
                (true, _) => println!("{}", json!({"dropped": rows.is_some(), "rows": rows})),
                (false, Some(rows)) => {
                    println!(
                        "dropped the table of mappings from before 16-byte storage: its {rows} rows were all copied"
                    )
                }
                (false, None) => println!("nothing to drop: no table of mappings from before 16-byte storage"),
            }
            Ok(())
        }
        PublicCommand::SealLegacy { config, owner, json } => {
            let config = idgen_public_ids::PublicIdsConfig::load(config.as_deref())?;
            let sealed = idgen_public_ids::seal_legacy(&config, owner.url.as_deref()).await?;
            if json {
                println!("{}", json!({"read": sealed.read, "untagged": sealed.untagged, "filter_bytes": sealed.bytes}));
            } else {
                println!(
                    "sealed: {} of {} opaque public IDs are untagged (made before check keys), in a filter of {} bytes; \
                     the instances take it up within 30 s",
                    sealed.untagged, sealed.read, sealed.bytes
                );
            }
            Ok(())
        }
        PublicCommand::RotateCheckKey { config, owner, json } => {
            let config = idgen_public_ids::PublicIdsConfig::load(config.as_deref())?;
            let version = idgen_public_ids::rotate_check_key(&config, owner.url.as_deref())
                .await?
                .context("all 255 check key versions are used")?;
            if json {
                println!("{}", json!({"check_key_version": version, "used_from_secs": 120}));
            } else {
                println!("check key version {version} added: new opaque public IDs carry it two minutes from now");
            }
            Ok(())
        }
        PublicCommand::RetireCheckKey { config, version, force, owner, json } => {
            use idgen_public_ids::store::check::RetiredKey;
            let config = idgen_public_ids::PublicIdsConfig::load(config.as_deref())?;
            match idgen_public_ids::retire_check_key(&config, owner.url.as_deref(), version, force).await? {
                RetiredKey::Retired { moved, filter_sealed } => {
                    if json {
                        println!(
                            "{}",
                            json!({"retired": version, "moved_to_filter": moved, "filter_sealed": filter_sealed})
                        );
                    } else if moved == 0 {
                        println!(
                            "check key version {version} retired (no public ID was made under it); the instances drop it within 30 s"
                        );
                    } else {
                        println!(
                            "check key version {version} retired: its {moved} public IDs now resolve as untagged ones ({}); the \
                             instances drop it within 30 s",
                            if filter_sealed {
                                "in the rebuilt legacy filter"
                            } else {
                                "the legacy filter is still open"
                            }
                        );
                    }
                    Ok(())
                }
                RetiredKey::InUse { made } => anyhow::bail!(
                    "check key version {version} tags {made} public IDs: retiring it would leave them to the legacy filter \
                     (each forged ID then passes the check one time in 2,048, and costs a read); run again with --force \
                     to do so"
                ),
            }
        }
        PublicCommand::RotateKey { config, owner, json } => {
            let config = idgen_public_ids::PublicIdsConfig::load(config.as_deref())?;
            let kms = config.kms.as_ref().context("no [kms] section: the encrypted format is not configured")?;
            let within = std::time::Duration::from_millis(config.sqlite_open_timeout_ms);
            let url = owner.url.as_deref().unwrap_or(config.database_url());
            let store = idgen_public_ids::store::PublicIdStore::open(url, within).await?;
            let client = idgen_public_ids::kms::client(&kms.settings()).await;
            let version =
                idgen_public_ids::kms::add_key_version(&store, &client, &kms.key_id, &Default::default()).await?;
            if json {
                println!("{}", json!({"key_version": version, "key_id": kms.key_id, "restart_needed": true}));
            } else {
                println!("data key version {version} added; restart the service to encrypt with it");
            }
            Ok(())
        }
    }
}
