//! What a generator needs from the region registry: its region number, the layout schedule with
//! its horizon, and who the home region is. Fetched at start-up and refreshed periodically; the
//! last good copy is kept on local disk, so a restart during a registry outage still works (until
//! the copy's horizon passes: then the generator refuses, it never guesses).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use idgen_core::{Layout, Schedule, ScheduleEntry, Timestamp};

use crate::lease::genesis::Genesis;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutWire {
    pub name: String,
    pub region_bits: u8,
    pub machine_bits: u8,
    pub sequence_bits: u8,
    /// ms since the idgen epoch.
    pub from_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionWire {
    pub name: String,
    pub number: u32,
    pub status: String,
    /// A retirement the registry has scheduled (RFC 3339, UTC): the region issues until then and
    /// not from then on. Absent from copies saved before retirements had a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires_at: Option<String>,
    /// The lease table the region's generators claim in, per layout. Absent from the answers of
    /// a registry, and from copies saved, before the registry named them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lease_tables: BTreeMap<String, LeaseTableWire>,
}

/// The lease table a region's generators use under one layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTableWire {
    pub table: String,
    /// The table it replaced, when an operator moved the region to this one: a generator claims
    /// here only once this table was adopted from that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// Which table of that name it is: the genesis `table_id` recorded by its first `idgen
    /// leases init`. Absent until recorded (and from a registry, or a copy, of an earlier
    /// release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_id: Option<String>,
}

impl RegionWire {
    /// `retires_at` in Unix ms.
    pub fn retires_at_ms(&self) -> Result<Option<i64>, RegistryError> {
        self.retires_at
            .as_deref()
            .map(|text| {
                idgen_core::parse_rfc3339_ms(text).ok_or_else(|| {
                    RegistryError::Invalid(format!("region {}: retires_at {text:?} is not a UTC time", self.name))
                })
            })
            .transpose()
    }
}

/// One consistent copy of what the registry publishes (the wire shapes of SPEC §5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrySnapshot {
    pub layouts: Vec<LayoutWire>,
    pub horizon_ms: u64,
    pub home_region: String,
    pub regions: Vec<RegionWire>,
    /// The registry's identity, made once when its database was initialized: a registry started
    /// over has another. Absent from the answers of a registry, and from copies saved, before
    /// registries had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_id: Option<String>,
}

#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("registry unreachable: {0}")]
    Unreachable(String),
    #[error("registry answered something that is not a valid schedule: {0}")]
    Invalid(String),
    #[error("region {0:?} is not an active region in the registry")]
    UnknownRegion(String),
    #[error("the registry's answer contradicts the copy held: {0}")]
    Contradicts(String),
    #[error("schedule cache {path}: {error}")]
    Cache { path: String, error: String },
}

/// Whether `url` may name the registry: `https://`, or, where `plain_http_on_loopback`, a plain
/// `http://` registry on this machine's loopback (a development one: nothing crosses a network).
/// The registry's answer decides the layout and the region bits of every ID, and carries operator
/// credentials the other way: over plain HTTP on a network anyone on the path could change the
/// schedule a generator takes, or read a token.
pub fn check_registry_url(url: &str, plain_http_on_loopback: bool) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("registry URL {url:?}: {e}"))?;
    let host = parsed.host_str().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" if !host.is_empty() => Ok(()),
        "http" if plain_http_on_loopback && loopback => Ok(()),
        "http" if plain_http_on_loopback => Err(format!(
            "registry URL {url:?}: use https:// (plain http:// is for a development registry on 127.0.0.1 or localhost)"
        )),
        "http" => Err(format!("registry URL {url:?}: use https:// (plain http:// is for development only)")),
        _ => Err(format!("registry URL {url:?}: an https:// URL with a host")),
    }
}

/// An HTTP client for the registry: `timeout` per request, and TLS with this rustls
/// configuration (the CA to trust, the client certificate to present) when given.
pub fn registry_client(timeout: Duration, tls: Option<rustls::ClientConfig>) -> Result<reqwest::Client, RegistryError> {
    let builder = reqwest::Client::builder().timeout(timeout);
    let builder = match tls {
        Some(config) => builder.use_preconfigured_tls(config),
        None => builder,
    };
    builder.build().map_err(|e| RegistryError::Unreachable(e.to_string()))
}

#[derive(Deserialize)]
struct LayoutsResponse {
    layouts: Vec<LayoutWire>,
    horizon_ms: u64,
    home_region: String,
    #[serde(default)]
    registry_id: Option<String>,
}

#[derive(Deserialize)]
struct RegionsResponse {
    regions: Vec<RegionWire>,
}

impl RegistrySnapshot {
    /// Fetches `GET /v1/layouts` and `GET /v1/regions` over plain HTTP.
    pub async fn fetch(base_url: &str, timeout: Duration) -> Result<Self, RegistryError> {
        Self::fetch_with(&registry_client(timeout, None)?, base_url).await
    }

    /// The same with a client of the caller's (its TLS settings and timeout).
    pub async fn fetch_with(http: &reqwest::Client, base_url: &str) -> Result<Self, RegistryError> {
        let get = |path: &'static str| {
            let request = http.get(format!("{}{path}", base_url.trim_end_matches('/')));
            async move {
                let response = request.send().await.map_err(|e| RegistryError::Unreachable(e.to_string()))?;
                if !response.status().is_success() {
                    return Err(RegistryError::Unreachable(format!("{path}: HTTP {}", response.status())));
                }
                response.bytes().await.map_err(|e| RegistryError::Unreachable(e.to_string()))
            }
        };
        Self::from_responses(&get("/v1/layouts").await?, &get("/v1/regions").await?)
    }

    /// The registry's two answers (`GET /v1/layouts`, `GET /v1/regions`) as one snapshot, whose
    /// schedule must be valid.
    pub fn from_responses(layouts: &[u8], regions: &[u8]) -> Result<Self, RegistryError> {
        let layouts: LayoutsResponse =
            serde_json::from_slice(layouts).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let regions: RegionsResponse =
            serde_json::from_slice(regions).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let snapshot = RegistrySnapshot {
            layouts: layouts.layouts,
            horizon_ms: layouts.horizon_ms,
            home_region: layouts.home_region,
            regions: regions.regions,
            registry_id: layouts.registry_id,
        };
        snapshot.check()?;
        Ok(snapshot)
    }

    /// A valid schedule, and a time in every scheduled retirement.
    fn check(&self) -> Result<(), RegistryError> {
        self.schedule()?;
        self.regions.iter().try_for_each(|region| region.retires_at_ms().map(drop))
    }

    pub fn schedule(&self) -> Result<Schedule, RegistryError> {
        let entries = self
            .layouts
            .iter()
            .map(|l| {
                let layout = Layout::new(l.name.clone(), l.region_bits, l.machine_bits, l.sequence_bits)
                    .map_err(|e| RegistryError::Invalid(e.to_string()))?;
                let from = Timestamp::from_millis(l.from_ms)
                    .ok_or_else(|| RegistryError::Invalid(format!("from_ms {}", l.from_ms)))?;
                Ok(ScheduleEntry { layout, from })
            })
            .collect::<Result<Vec<_>, RegistryError>>()?;
        Schedule::new(entries, self.horizon_ms).map_err(|e| RegistryError::Invalid(e.to_string()))
    }

    /// This region's number, if it is active.
    pub fn region_number(&self, name: &str) -> Result<u32, RegistryError> {
        self.active_region(name).map(|r| r.number)
    }

    /// This region's entry, if it is active (in its grace too: it issues until `retires_at`).
    pub fn active_region(&self, name: &str) -> Result<&RegionWire, RegistryError> {
        self.regions
            .iter()
            .find(|r| r.name == name && r.status == "active")
            .ok_or_else(|| RegistryError::UnknownRegion(name.to_owned()))
    }

    /// Whether this copy may replace `held` in a generator of `region`: the schedule only moves
    /// forward ([`Schedule::check_successor`]), and neither the region's number, the home region
    /// nor the registry's identity changes. A registry restored from an old backup, one started
    /// over, or a different registry, fails this; a generator that took such an answer could share
    /// a millisecond's layout, region or machine bits with one that did not.
    pub fn may_replace(&self, held: &RegistrySnapshot, region: &str) -> Result<(), RegistryError> {
        // A registry with another identity is another registry, or this one started over: its
        // region numbers may be handed out again. A copy saved before registries had one takes
        // the first identity it meets.
        if let Some(held_id) = &held.registry_id
            && self.registry_id.as_ref() != Some(held_id)
        {
            return Err(RegistryError::Contradicts(format!(
                "the registry was {held_id}, now {}: a registry started over (a new database, or a backup \
                 restored) numbers regions from 0 again",
                self.registry_id.as_deref().unwrap_or("one without an identity")
            )));
        }
        held.schedule()?.check_successor(&self.schedule()?).map_err(|e| RegistryError::Contradicts(e.to_string()))?;
        // A region retired and added again has a new, never-used number, and its old one is
        // listed as retired under its name: that is the registry working, not a contradiction.
        let retired_since =
            |number: u32| self.regions.iter().any(|r| r.name == region && r.number == number && r.status == "retired");
        if let (Ok(before), Ok(now)) = (held.region_number(region), self.region_number(region))
            && before != now
            && !retired_since(before)
        {
            return Err(RegistryError::Contradicts(format!("region {region} was number {before}, now {now}")));
        }
        if held.home_region != self.home_region {
            return Err(RegistryError::Contradicts(format!(
                "the home region was {}, now {}",
                held.home_region, self.home_region
            )));
        }
        Ok(())
    }

    /// Whether a generator of `region` holding this answer of the registry (or its copy on disk)
    /// may claim in `table` under `layout`, whose genesis is `genesis` (`None`: the caller is about to
    /// write one, `idgen leases init`). The registry names each region's table per layout: a
    /// generator claims in that table and no other, a table the registry moved there only once it was
    /// adopted from the one it replaces, one whose genesis names this registry, and one whose genesis
    /// is the table the registry recorded (`table_id`): a second table of the same name (another AWS
    /// region's, another host's SQLite file) has a genesis of its own. Where the registry holds no
    /// identity yet (before the table's first `idgen leases init` recorded it), only a development
    /// generator (`unrecorded_ok`, whose `lease.create_tables` writes the genesis itself but cannot
    /// write to the registry) claims.
    ///
    /// A registry of an earlier release (no identity in its answer) names no tables: nothing is
    /// checked against it until it is upgraded.
    pub fn check_lease_table(
        &self,
        region: &str,
        layout: &str,
        table: &str,
        genesis: Option<&Genesis>,
        unrecorded_ok: bool,
    ) -> Result<(), String> {
        let Some(registry_id) = &self.registry_id else { return Ok(()) };
        let entry =
            self.active_region(region).ok().and_then(|entry| entry.lease_tables.get(layout)).ok_or_else(|| {
                format!("the registry names no lease table for region {region} under layout {layout}")
            })?;
        if entry.table != table {
            return Err(format!(
                "lease table {table} is not region {region}'s table for layout {layout}: the registry names {named}. \
                 Generators claim only in the table their region's entry names, so a table made beside the live one \
                 cannot hand out numbers held there. Point lease.tables.{layout} at {named}; to move the region to \
                 {table}, adopt it (`idgen leases adopt --from-table {named}`) and then `idgen regions \
                 move-lease-table {region} --confirm {region} --layout {layout} --from {named} --to {table}` \
                 (runbooks/lease-table-restore.md)",
                named = entry.table
            ));
        }
        let Some(genesis) = genesis else { return Ok(()) };
        match &genesis.registry_id {
            None => {
                return Err(format!(
                    "lease table {table}'s genesis names no registry, and this generator follows one: run `idgen \
                     leases init --config <this configuration>`, which records the registry ({registry_id})"
                ));
            }
            Some(held) if held != registry_id => {
                return Err(format!(
                    "lease table {table} belongs to the region of registry {held} (its genesis says so), but the \
                     registry answers as {registry_id}: a registry started over (a new database, or one restored from \
                     a backup older than this table) numbers regions from 0 again, and a region number handed out \
                     twice is two regions issuing the same IDs. Nothing is claimed here until the registry is the \
                     one this table was made for (runbooks/lease-table-restore.md)"
                ));
            }
            Some(_) => {}
        }
        match &entry.table_id {
            Some(recorded) if *recorded != genesis.table_id => {
                return Err(format!(
                    "lease table {table} is not the table the registry holds for region {region} under layout \
                     {layout}: its genesis is {mine}, and the registry recorded {recorded} at the first `idgen leases \
                     init` of the region's {table}. It is another table of the same name (another AWS region's, \
                     another host's SQLite file), and the numbers its rows show free are held in the recorded one: \
                     point this generator at the recorded table; to move the region to this one, adopt it (`idgen \
                     leases adopt --from-table <the recorded table>`) and then `idgen regions move-lease-table` \
                     (runbooks/lease-table-restore.md)",
                    mine = genesis.table_id
                ));
            }
            Some(_) => {}
            None if unrecorded_ok => {}
            None => {
                return Err(format!(
                    "the registry holds no identity for region {region}'s {layout} lease table {table} yet, so \
                     nothing tells this table from another of the same name: run `idgen leases init --config <this \
                     configuration>` with an operator's token, which records this one's (genesis {})",
                    genesis.table_id
                ));
            }
        }
        if let Some(old) = &entry.moved_from {
            let adopted = genesis.how.adopted_from().is_some_and(|from| from == old || from == "gone");
            if !adopted {
                return Err(format!(
                    "the registry moved region {region}'s {layout} lease table here from {old}, but {table} was not \
                     adopted from it: a claim here could take a number whose holder issues in {old}. Run `idgen leases \
                     adopt --from-table {old}` (or --source-gone) first (runbooks/lease-table-restore.md)"
                ));
            }
        }
        Ok(())
    }

    /// Every region's name by number (retired ones too: their IDs still decode).
    pub fn region_names(&self) -> std::collections::HashMap<u32, String> {
        self.regions.iter().map(|r| (r.number, r.name.clone())).collect()
    }

    /// Decodes an ID locally with this copy's schedule, naming its region (v2 and later).
    pub fn decode(&self, id: u64) -> Result<(idgen_core::DecodedId, Option<String>), RegistryError> {
        let decoded = self.schedule()?.decode(id).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let name = decoded.region_number.and_then(|n| self.region_names().remove(&n));
        Ok((decoded, name))
    }

    /// Writes the copy atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let cache_error =
            |error: std::io::Error| RegistryError::Cache { path: path.display().to_string(), error: error.to_string() };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(cache_error)?;
        }
        // Unique per writer: processes sharing one configuration share this path.
        let temporary = path.with_extension(format!("{}.{:08x}.tmp", std::process::id(), rand::random::<u32>()));
        let text = serde_json::to_vec_pretty(self).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        // Durable before it replaces the old copy: after a power loss the copy is the old one or
        // the new one, never an empty or torn file a restart would refuse.
        let mut file = std::fs::File::create(&temporary).map_err(cache_error)?;
        std::io::Write::write_all(&mut file, &text).map_err(cache_error)?;
        file.sync_all().map_err(cache_error)?;
        std::fs::rename(&temporary, path).map_err(cache_error)?;
        let directory = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(directory).and_then(|d| d.sync_all()).map_err(cache_error)
    }

    /// Every number the region `name` has had, active or retired (its IDs decode to any of them).
    pub fn region_numbers(&self, name: &str) -> Vec<u32> {
        self.regions.iter().filter(|r| r.name == name).map(|r| r.number).collect()
    }

    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let text = std::fs::read(path)
            .map_err(|e| RegistryError::Cache { path: path.display().to_string(), error: e.to_string() })?;
        Self::from_cache(&text, path)
    }

    /// The copy on disk (what [`RegistrySnapshot::save`] wrote to `path`), whose schedule must be
    /// valid.
    pub fn from_cache(bytes: &[u8], path: &Path) -> Result<Self, RegistryError> {
        let snapshot: RegistrySnapshot = serde_json::from_slice(bytes)
            .map_err(|e| RegistryError::Cache { path: path.display().to_string(), error: e.to_string() })?;
        snapshot.check()?;
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_is_reached_over_https_or_on_loopback_in_development() {
        for url in ["https://registry.idgen.internal:8700", "https://10.0.0.5"] {
            assert_eq!(check_registry_url(url, false), Ok(()), "{url}");
        }
        for url in ["http://127.0.0.1:8700", "http://localhost:8700", "http://[::1]:8700", "http://127.1.2.3"] {
            assert_eq!(check_registry_url(url, true), Ok(()), "{url}");
            assert!(check_registry_url(url, false).unwrap_err().contains("https://"), "{url}");
        }
        for url in
            ["http://registry.idgen.internal:8700", "http://10.0.0.5:8700", "ftp://x", "registry:8700", "https://"]
        {
            assert!(check_registry_url(url, true).is_err(), "{url}");
        }
    }

    fn region(name: &str, number: u32, status: &str) -> RegionWire {
        RegionWire { name: name.into(), number, status: status.into(), retires_at: None, lease_tables: BTreeMap::new() }
    }

    fn snapshot() -> RegistrySnapshot {
        RegistrySnapshot {
            layouts: vec![
                LayoutWire { name: "v1".into(), region_bits: 0, machine_bits: 10, sequence_bits: 12, from_ms: 0 },
                LayoutWire {
                    name: "v2".into(),
                    region_bits: 3,
                    machine_bits: 9,
                    sequence_bits: 10,
                    from_ms: 63_072_000_000,
                },
            ],
            horizon_ms: 70_000_000_000,
            home_region: "us-east-1".into(),
            regions: vec![
                region("us-east-1", 0, "active"),
                region("eu-west-1", 2, "active"),
                region("old-1", 1, "retired"),
            ],
            registry_id: None,
        }
    }

    #[test]
    fn decodes_locally_with_region_names() {
        let s = snapshot();
        let (decoded, region) = s.decode(683_244_571_854_022_659).unwrap();
        assert_eq!((decoded.layout.name(), decoded.machine, region.as_deref()), ("v2", 170, Some("eu-west-1")));
        let (decoded, region) = s.decode(97_301_141_913_751_557).unwrap();
        assert_eq!((decoded.layout.name(), decoded.machine, region), ("v1", 37, None));
        assert_eq!(s.region_number("eu-west-1").unwrap(), 2);
        assert!(s.region_number("old-1").is_err(), "a retired region cannot issue");
    }

    #[test]
    fn the_disk_copy_round_trips_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/schedule.json");
        snapshot().save(&path).unwrap();
        assert_eq!(RegistrySnapshot::load(&path).unwrap(), snapshot());
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(RegistrySnapshot::load(&path), Err(RegistryError::Cache { .. })));
        let mut bad = snapshot();
        bad.layouts[1].machine_bits = 10; // bits no longer sum to 22
        bad.save(&path).unwrap();
        assert!(RegistrySnapshot::load(&path).is_err());
    }

    #[test]
    fn a_scheduled_retirement_is_read_from_the_registry_and_from_an_older_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schedule.json");
        // A copy saved before retirements had a time loads, with none scheduled.
        let old = r#"{"layouts":[{"name":"v1","region_bits":0,"machine_bits":10,"sequence_bits":12,"from_ms":0}],
            "horizon_ms":5,"home_region":"us-east-1","regions":[{"name":"eu-west-1","number":2,"status":"active"}]}"#;
        let loaded = RegistrySnapshot::from_cache(old.as_bytes(), &path).unwrap();
        assert_eq!(loaded.active_region("eu-west-1").unwrap().retires_at_ms().unwrap(), None);

        let layouts = br#"{"layouts":[{"name":"v1","region_bits":0,"machine_bits":10,"sequence_bits":12,"from_ms":0}],"horizon_ms":5,"home_region":"us-east-1"}"#;
        let regions = br#"{"regions":[{"name":"eu-west-1","number":2,"status":"active","retires_at":"2026-11-19T11:06:40.000Z"}]}"#;
        let fetched = RegistrySnapshot::from_responses(layouts, regions).unwrap();
        let retires_at = fetched.active_region("eu-west-1").unwrap().retires_at_ms().unwrap();
        assert_eq!(retires_at, Some(1_795_086_400_000));
        fetched.save(&path).unwrap();
        assert_eq!(RegistrySnapshot::load(&path).unwrap(), fetched, "kept in the copy on disk");

        let garbled = br#"{"regions":[{"name":"eu-west-1","number":2,"status":"active","retires_at":"tomorrow"}]}"#;
        assert!(matches!(RegistrySnapshot::from_responses(layouts, garbled), Err(RegistryError::Invalid(_))));
    }

    #[test]
    fn a_newer_copy_may_only_move_forward() {
        let held = snapshot();
        let mut later = snapshot();
        later.horizon_ms += 86_400_000;
        later.regions.push(region("ap-south-1", 3, "active"));
        later.may_replace(&held, "eu-west-1").unwrap();

        // A registry restored from an old backup: the horizon is back where it was a day ago.
        assert!(matches!(held.may_replace(&later, "eu-west-1"), Err(RegistryError::Contradicts(_))));
        // Another registry, or a reset one: v2 starts elsewhere, before the held horizon.
        let mut moved = later.clone();
        moved.layouts[1].from_ms -= 1_000;
        assert!(matches!(moved.may_replace(&held, "eu-west-1"), Err(RegistryError::Contradicts(_))));
        // The region was renumbered, or the home region moved.
        let mut renumbered = later.clone();
        renumbered.regions[1].number = 4;
        assert!(renumbered.may_replace(&held, "eu-west-1").unwrap_err().to_string().contains("was number 2, now 4"));
        // Retired and added again: the old number is listed as retired, the new one is new.
        let mut re_added = renumbered.clone();
        re_added.regions.push(region("eu-west-1", 2, "retired"));
        re_added.may_replace(&held, "eu-west-1").unwrap();
        let mut rehomed = later;
        rehomed.home_region = "eu-west-1".into();
        assert!(rehomed.may_replace(&held, "us-east-1").is_err());
    }

    #[test]
    fn a_registry_with_another_identity_is_refused_once_one_was_held() {
        let held = RegistrySnapshot { registry_id: Some("r1".into()), ..snapshot() };
        let mut later = held.clone();
        later.horizon_ms += 1;
        later.may_replace(&held, "eu-west-1").unwrap();
        // Started over: another identity (or none: a registry of an earlier release).
        for other in [Some("r2".to_owned()), None] {
            let reset = RegistrySnapshot { registry_id: other, ..later.clone() };
            let refused = reset.may_replace(&held, "eu-west-1").unwrap_err().to_string();
            assert!(refused.contains("started over"), "{refused}");
        }
        // A copy saved before registries had an identity takes the first it meets.
        later.may_replace(&snapshot(), "eu-west-1").unwrap();
    }

    fn genesis(registry: Option<&str>, how: crate::lease::GenesisHow) -> Genesis {
        Genesis {
            table_id: "t".into(),
            registry_id: registry.map(str::to_owned),
            how,
            by: "oncall".into(),
            at_unix_ms: 0,
            table_created_unix_ms: None,
        }
    }

    #[test]
    fn a_generator_claims_only_in_the_table_its_region_names_bound_to_this_registry() {
        use crate::lease::GenesisHow;
        let table = |name: &str, moved_from: Option<&str>| LeaseTableWire {
            table: name.into(),
            moved_from: moved_from.map(str::to_owned),
            table_id: Some("t".into()),
        };
        let mut s = RegistrySnapshot { registry_id: Some("r1".into()), ..snapshot() };
        s.regions[1].lease_tables = BTreeMap::from([
            ("v1".into(), table("idgen-leases", None)),
            ("v2".into(), table("idgen-leases-v2-restored", Some("idgen-leases-v2"))),
        ]);
        let init = genesis(Some("r1"), GenesisHow::Init);
        for development in [false, true] {
            s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&init), development).unwrap();
            s.check_lease_table("eu-west-1", "v1", "idgen-leases", None, development).unwrap();
        }
        // Another table: a fresh one beside the live one.
        let fresh = s.check_lease_table("eu-west-1", "v1", "idgen-leases-new", Some(&init), true).unwrap_err();
        assert!(fresh.contains("names idgen-leases") && fresh.contains("move-lease-table"), "{fresh}");
        // No table named for the layout, or the region unknown.
        assert!(s.check_lease_table("eu-west-1", "v3", "idgen-leases-v3", None, true).is_err());
        assert!(s.check_lease_table("old-1", "v1", "idgen-leases", None, true).is_err());
        // The table's genesis names no registry, or another (this one started over).
        let unbound =
            s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&genesis(None, GenesisHow::Init)), true);
        assert!(unbound.unwrap_err().contains("idgen leases init"));
        let other =
            s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&genesis(Some("r0"), GenesisHow::Init)), true);
        assert!(other.unwrap_err().contains("started over"));
        // A table moved here must have been adopted from the one it replaces.
        let moved = "idgen-leases-v2-restored";
        assert!(s.check_lease_table("eu-west-1", "v2", moved, Some(&init), true).unwrap_err().contains("adopt"));
        for from in ["idgen-leases-v2", "gone"] {
            let adopted = genesis(Some("r1"), GenesisHow::Adopted { from: from.into() });
            s.check_lease_table("eu-west-1", "v2", moved, Some(&adopted), false).unwrap();
        }
        let elsewhere = genesis(Some("r1"), GenesisHow::Adopted { from: "idgen-leases-other".into() });
        assert!(s.check_lease_table("eu-west-1", "v2", moved, Some(&elsewhere), true).is_err());
        // A registry of an earlier release names nothing: nothing to check against it.
        snapshot().check_lease_table("eu-west-1", "v1", "anything", None, false).unwrap();
    }

    #[test]
    fn a_second_table_of_the_same_name_is_refused_by_its_genesis() {
        use crate::lease::GenesisHow;
        let mut s = RegistrySnapshot { registry_id: Some("r1".into()), ..snapshot() };
        let named = |table_id: Option<&str>| {
            BTreeMap::from([(
                "v1".to_owned(),
                LeaseTableWire {
                    table: "idgen-leases".into(),
                    moved_from: None,
                    table_id: table_id.map(str::to_owned),
                },
            )])
        };
        let init = genesis(Some("r1"), GenesisHow::Init); // table_id "t"
        // The registry recorded another table of this name: refused, development or not.
        s.regions[1].lease_tables = named(Some("first"));
        for development in [false, true] {
            let second = s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&init), development).unwrap_err();
            assert!(second.contains("another table of the same name") && second.contains("first"), "{second}");
        }
        // Nothing recorded yet: a production generator waits for `leases init` to record it; a
        // development one (create_tables, no operator credential) claims.
        s.regions[1].lease_tables = named(None);
        let unrecorded = s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&init), false).unwrap_err();
        assert!(unrecorded.contains("idgen leases init") && unrecorded.contains("genesis t"), "{unrecorded}");
        s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&init), true).unwrap();
        // Recorded as this one: claimed in.
        s.regions[1].lease_tables = named(Some("t"));
        s.check_lease_table("eu-west-1", "v1", "idgen-leases", Some(&init), false).unwrap();
    }
}
