//! The keyed check that turns a forged opaque public ID away in memory, before any database read.
//!
//! Every opaque public ID made since check keys exist carries its own proof of origin, in its
//! 128 bits:
//!
//! ```text
//! byte 0       the check key's version (1 to 255)
//! bytes 1..12  88 random bits from the OS CSPRNG
//! bytes 12..16 the first 32 bits of HMAC-SHA256(check key, type number (2 bytes, 0: untyped) ‖ bytes 0..12)
//! ```
//!
//! A resolve checks the tag ([`Gate::judge`]) once the cache has missed: a random ID fails it with
//! probability 1 − 2⁻³², and is answered the one 404 without reading the replica or the primary.
//! The type number is under the tag, so a typed ID's characters under another prefix (or none)
//! fail it too.
//!
//! **Why 88 random bits are enough.** The design's floor is the 74 random bits of a UUIDv7. A
//! public ID must be unguessable and must not collide. Guessing an existing opaque ID means
//! guessing 88 random bits *and* the 32-bit tag of a key the caller never sees: one in 2¹²⁰ per
//! try per mapping. Collisions are retried by the create (the database refuses a public ID held
//! twice), and are rare: among 10¹⁰ IDs of one key version, about 10²⁰ / 2⁸⁹ ≈ 2·10⁻⁷.
//!
//! **Mappings made before** (untagged: 128 random bits) keep resolving for ever. They are told
//! from forged IDs by a Bloom filter of their public IDs ([`LegacyFilter`], 1 in 2,048 false positives,
//! indexed by a keyed hash so that a caller who knows some old IDs cannot aim at its set bits),
//! built and sealed by `idgen public seal-legacy` once no instance of the previous version (which
//! makes untagged IDs) runs. Until it is sealed, every untagged ID is read as before (replica,
//! then the primary within its budget); once sealed, a forged ID that looks like an old one costs
//! a read with probability 1/2,048, once (its miss is then remembered) — and a real old one always
//! resolves. A database made new at this
//! version has an empty, sealed filter from `init` on.
//!
//! **Keys** live in the database (`public_id_check_keys`, read by the service's role), as the
//! mappings do: whoever can read a key can read the table it guards, so it needs no other
//! secret. `idgen public rotate-check-key` adds a version; every instance reloads the keys every
//! [`REFRESH`], and a new version is used for new IDs only [`ROTATION_DELAY`] after it was added,
//! so no instance ever meets a version it does not know. UUIDv7 public IDs carry no tag (their 74
//! random bits are the floor): their misses are bounded by the primary-fallback budget and their
//! age ([`crate::store`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use arc_swap::ArcSwap;
use hmac::{Hmac, Mac};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::format::{RandomSource, RandomUnavailable, crockford_encode};

type HmacSha256 = Hmac<Sha256>;

/// The bytes of the tag at the end of a checked opaque public ID.
pub const TAG_BYTES: usize = 4;
/// The random bytes between the key version and the tag: 88 bits.
pub const RANDOM_BYTES: usize = 11;
/// How long after it was added a check key version is used for new IDs (the lowest version at
/// once: no instance can be without it, as it exists before any instance of this version starts).
pub const ROTATION_DELAY: Duration = Duration::from_secs(120);
/// How often an instance reloads the check keys and the legacy filter's state.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How long one reload may wait for the database: a database gone silent fails it, and the next
/// is tried, instead of the reloads stopping there.
pub const REFRESH_DEADLINE: Duration = Duration::from_secs(5);
/// Keys last reloaded longer ago than this may lack a version added since and already in use
/// ([`ROTATION_DELAY`] after it was added): an ID of a version newer than every known one is then
/// read, not refused, and a reload is asked for at once. Reloaded more recently, such an ID is
/// forged: a version in use was added [`ROTATION_DELAY`] ago at least, before the last reload
/// (half the delay is left for the clocks of the instances and of `rotate-check-key` to differ).
pub const STALE_AFTER: Duration = Duration::from_secs(60);
/// How far ahead of this instance's clock a UUIDv7 public ID may be dated and still be one an
/// instance made (their clocks differ by less): one dated later is forged, refused in memory.
pub const UUIDV7_AHEAD: Duration = Duration::from_secs(60);
/// A check key's length.
pub const KEY_BYTES: usize = 32;

/// One version of the check key, as stored.
#[derive(Clone)]
pub struct StoredCheckKey {
    pub version: u8,
    pub key: Zeroizing<Vec<u8>>,
    pub created_at_ms: i64,
}

/// The check keys an instance knows, each keyed once.
#[derive(Clone)]
pub struct CheckKeys {
    keys: BTreeMap<u8, (HmacSha256, i64)>,
}

impl CheckKeys {
    /// `None` when there is no key (the database was not initialized by this version).
    pub fn new(stored: &[StoredCheckKey]) -> Option<CheckKeys> {
        let keys: BTreeMap<u8, (HmacSha256, i64)> = stored
            .iter()
            .filter(|k| k.version != 0)
            .map(|k| (k.version, (HmacSha256::new_from_slice(&k.key).expect("HMAC takes any key"), k.created_at_ms)))
            .collect();
        (!keys.is_empty()).then_some(CheckKeys { keys })
    }

    /// The versions known, oldest first.
    pub fn versions(&self) -> Vec<u8> {
        self.keys.keys().copied().collect()
    }

    /// Whether `version` is newer than every known one (a version this instance may have missed).
    fn is_newer(&self, version: u8) -> bool {
        self.keys.keys().next_back().is_some_and(|newest| version > *newest)
    }

    /// The version new IDs are made with at `now_ms`: the highest one added at least
    /// [`ROTATION_DELAY`] ago, or the lowest.
    pub fn current(&self, now_ms: i64) -> u8 {
        let lowest = *self.keys.keys().next().expect("at least one key");
        let delay = ROTATION_DELAY.as_millis() as i64;
        self.keys.iter().rev().find(|(_, (_, created))| created + delay <= now_ms).map_or(lowest, |(v, _)| *v)
    }

    fn tag_of(mac: &HmacSha256, type_number: Option<u16>, head: &[u8]) -> HmacSha256 {
        let mut mac = mac.clone();
        mac.update(&type_number.unwrap_or(0).to_be_bytes());
        mac.update(head);
        mac
    }

    /// A new checked opaque public ID of `type_number`, as its 26 characters.
    pub fn new_opaque(
        &self,
        random: &dyn RandomSource,
        type_number: Option<u16>,
        now_ms: i64,
    ) -> Result<String, RandomUnavailable> {
        let version = self.current(now_ms);
        let mut bytes = [0u8; 16];
        bytes[0] = version;
        random.fill(&mut bytes[1..1 + RANDOM_BYTES])?;
        let mac = &self.keys[&version].0;
        let tag = Self::tag_of(mac, type_number, &bytes[..16 - TAG_BYTES]).finalize().into_bytes();
        bytes[16 - TAG_BYTES..].copy_from_slice(&tag[..TAG_BYTES]);
        Ok(crockford_encode(&bytes))
    }

    /// Whether `bytes` carry the tag of a known key for `type_number` (compared in constant time).
    pub fn verifies(&self, bytes: &[u8; 16], type_number: Option<u16>) -> bool {
        let Some((mac, _)) = self.keys.get(&bytes[0]) else { return false };
        Self::tag_of(mac, type_number, &bytes[..16 - TAG_BYTES]).verify_truncated_left(&bytes[16 - TAG_BYTES..]).is_ok()
    }
}

/// A Bloom filter of the untagged opaque public IDs made before check keys existed.
#[derive(Clone)]
pub struct LegacyFilter {
    key: HmacSha256,
    hashes: u32,
    bits: Arc<[u8]>,
}

/// A legacy filter as stored: its hash key, number of hashes, bits and how many IDs it holds.
#[derive(Clone)]
pub struct StoredFilter {
    pub sealed: bool,
    pub filter_key: Zeroizing<Vec<u8>>,
    pub hashes: u32,
    pub bits: Vec<u8>,
    pub entries: i64,
    pub built_at_ms: i64,
}

/// Bits per entry and hashes for a false-positive rate of 1 in 2,048 (−ln p / ln² 2, and ln 2
/// times that): a flood of forged IDs costs at most 0.0005 reads each (1 % before, a read in a
/// hundred: a filter sealed then keeps its own rate until `seal-legacy` is run again).
const BITS_PER_ENTRY: f64 = 15.87;
const HASHES: u32 = 11;
/// The smallest filter, 2 KiB. Double hashing's probes of one ID are an arithmetic progression
/// modulo the filter's size: in a filter of a few hundred bits, a forged ID whose step matches a
/// stored one's passes far more often than the rate above (0.5–0.8 % of forged IDs passed a
/// 64-bit filter of 3 IDs); from a few thousand bits on, that excess is negligible.
const MIN_FILTER_BITS: u64 = 16_384;

impl LegacyFilter {
    /// An empty filter sized for `expected` IDs (at least [`MIN_FILTER_BITS`]), under `filter_key`.
    pub fn sized(filter_key: &[u8], expected: u64) -> LegacyFilter {
        let bits = ((expected as f64 * BITS_PER_ENTRY).ceil() as u64).max(MIN_FILTER_BITS).div_ceil(8);
        LegacyFilter::from_parts(filter_key, HASHES, vec![0u8; bits as usize])
    }

    pub fn from_parts(filter_key: &[u8], hashes: u32, bits: Vec<u8>) -> LegacyFilter {
        let key = HmacSha256::new_from_slice(filter_key).expect("HMAC takes any key");
        LegacyFilter { key, hashes: hashes.max(1), bits: bits.into() }
    }

    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    pub fn bits(&self) -> &[u8] {
        &self.bits
    }

    /// The filter's bit positions of `public_id` (double hashing over a keyed hash).
    fn positions(&self, public_id: &[u8; 16]) -> impl Iterator<Item = usize> + use<> {
        let mut mac = self.key.clone();
        mac.update(public_id);
        let hash = mac.finalize().into_bytes();
        let h1 = u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"));
        let h2 = u64::from_le_bytes(hash[8..16].try_into().expect("8 bytes")) | 1;
        let m = (self.bits.len() * 8) as u64;
        (0..u64::from(self.hashes)).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize)
    }

    pub fn insert(&mut self, public_id: &[u8; 16]) {
        let positions: Vec<usize> = self.positions(public_id).collect();
        let bits = Arc::get_mut(&mut self.bits).expect("a filter being built is not shared");
        for p in positions {
            bits[p / 8] |= 1 << (p % 8);
        }
    }

    pub fn contains(&self, public_id: &[u8; 16]) -> bool {
        self.positions(public_id).all(|p| self.bits[p / 8] & (1 << (p % 8)) != 0)
    }
}

/// Whether old untagged IDs can still be told from forged ones.
#[derive(Clone)]
pub enum Legacy {
    /// Not sealed: instances of the previous version may still make untagged IDs, so every
    /// untagged ID is read.
    Open,
    /// Sealed: the untagged IDs are those in the filter.
    Sealed(Box<LegacyFilter>),
}

/// What a resolve's check found of a stored public ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Carries a valid tag: read it.
    Tagged,
    /// Untagged, and possibly made before check keys: read it.
    Legacy,
    /// Neither (or a UUIDv7 dated ahead of every instance's clock): the 404, without a read.
    Forged,
    /// A UUIDv7: nothing to check in memory (read it, within the fallback budget and its age).
    Unchecked,
    /// Of a key version newer than every known one while the keys are stale ([`STALE_AFTER`]):
    /// possibly made under a version this instance missed, so read (within the fallback budget),
    /// never refused; a reload is asked for at once.
    StaleKeys,
}

impl Verdict {
    /// In declaration order, so that `verdict as usize` is its place here.
    const ALL: [Verdict; 5] =
        [Verdict::Tagged, Verdict::Legacy, Verdict::Forged, Verdict::Unchecked, Verdict::StaleKeys];

    fn label(self) -> &'static str {
        match self {
            Verdict::Tagged => "tagged",
            Verdict::Legacy => "legacy",
            Verdict::Forged => "forged",
            Verdict::Unchecked => "unchecked",
            Verdict::StaleKeys => "stale_keys",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

/// What the check keys and the legacy filter are at one moment.
#[derive(Clone)]
pub struct GateState {
    pub keys: CheckKeys,
    pub legacy: Legacy,
    /// The stored filter's `built_at_ms` and seal, to see when it changed.
    pub filter_version: (i64, bool),
}

/// The check of stored public IDs before a read: the keys and the legacy filter, swapped whole
/// when they are reloaded; counts its verdicts.
pub struct Gate {
    state: ArcSwap<GateState>,
    verdicts: Family<VerdictLabel, Counter>,
    /// Each verdict's series of `verdicts`, in [`Verdict::ALL`]'s order: taken once, so that a
    /// flood of forged IDs costs no lookup of its label.
    counts: [Counter; 5],
    /// When `state` was last read from the database (ms since `origin`).
    loaded_ms: AtomicU64,
    origin: std::time::Instant,
    /// Asks the reloading task for a reload now ([`Verdict::StaleKeys`]).
    reload_now: tokio::sync::Notify,
}

impl Gate {
    pub fn new(state: GateState) -> Gate {
        let verdicts = Family::<VerdictLabel, Counter>::default();
        let counts =
            Verdict::ALL.map(|verdict| verdicts.get_or_create(&VerdictLabel { verdict: verdict.label() }).clone());
        // `origin` some time back: a load time before the gate was made (as a test sets) is
        // kept as it is rather than clamped to the gate's birth.
        let now = std::time::Instant::now();
        let origin = now.checked_sub(2 * STALE_AFTER).unwrap_or(now);
        Gate {
            state: ArcSwap::from_pointee(state),
            verdicts,
            counts,
            loaded_ms: AtomicU64::new(now.duration_since(origin).as_millis() as u64),
            origin,
            reload_now: tokio::sync::Notify::new(),
        }
    }

    pub fn state(&self) -> Arc<GateState> {
        self.state.load_full()
    }

    /// Puts a state just read from the database in force.
    pub fn replace(&self, state: GateState) {
        self.state.store(Arc::new(state));
        self.loaded_at(std::time::Instant::now());
    }

    /// Notes that the state in force was read from the database at `at`.
    pub fn loaded_at(&self, at: std::time::Instant) {
        let ms = at.saturating_duration_since(self.origin).as_millis() as u64;
        self.loaded_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long ago the state in force was read from the database.
    pub fn age(&self) -> Duration {
        let loaded = self.origin + Duration::from_millis(self.loaded_ms.load(std::sync::atomic::Ordering::Relaxed));
        std::time::Instant::now().saturating_duration_since(loaded)
    }

    /// Whether the database's "not found" for an ID of `verdict` is final: it carries a valid
    /// tag (only a create makes one, and answers it once stored), or it is untagged and the
    /// legacy filter is sealed (no untagged ID is made any more). Such a miss may be remembered.
    pub fn miss_is_final(&self, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Tagged => true,
            Verdict::Legacy => matches!(self.state.load().legacy, Legacy::Sealed(_)),
            Verdict::Forged | Verdict::Unchecked | Verdict::StaleKeys => false,
        }
    }

    /// Waits until a reload is asked for ([`Verdict::StaleKeys`]).
    pub async fn reload_asked(&self) {
        self.reload_now.notified().await
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "idgen_public_resolve_checks",
            "Resolves of stored public IDs the cache did not answer, by what the keyed check found: tagged (read), \
             legacy (untagged, possibly made before check keys: read), forged (answered 404 without a read), \
             unchecked (UUIDv7: read)",
            self.verdicts.clone(),
        );
    }

    /// A new opaque public ID of `type_number`, checked under the current key.
    pub fn new_opaque(
        &self,
        random: &dyn RandomSource,
        type_number: Option<u16>,
        now_ms: i64,
    ) -> Result<String, RandomUnavailable> {
        self.state.load().keys.new_opaque(random, type_number, now_ms)
    }

    /// What the check finds of the stored public ID `bytes` of `format` and `type_number`
    /// (counted).
    pub fn judge(&self, format: crate::format::Format, bytes: &[u8; 16], type_number: Option<u16>) -> Verdict {
        let verdict = match format {
            crate::format::Format::Opaque => {
                let state = self.state.load();
                if state.keys.verifies(bytes, type_number) {
                    Verdict::Tagged
                } else if state.keys.is_newer(bytes[0]) && self.age() > STALE_AFTER {
                    self.reload_now.notify_one();
                    Verdict::StaleKeys
                } else {
                    match &state.legacy {
                        Legacy::Open => Verdict::Legacy,
                        Legacy::Sealed(filter) if filter.contains(bytes) => Verdict::Legacy,
                        Legacy::Sealed(_) => Verdict::Forged,
                    }
                }
            }
            crate::format::Format::Uuidv7 if dated_ahead(bytes, idgen::system_unix_ms()) => Verdict::Forged,
            _ => Verdict::Unchecked,
        };
        self.counts[verdict as usize].inc();
        verdict
    }
}

/// Whether the UUIDv7 `bytes` is dated more than [`UUIDV7_AHEAD`] after `now_ms`: no instance made
/// it, and as it stays unresolvable it would never count as old enough for the replica's miss to
/// be final.
fn dated_ahead(bytes: &[u8; 16], now_ms: i64) -> bool {
    let mut made = [0u8; 8];
    made[2..].copy_from_slice(&bytes[..6]);
    u64::from_be_bytes(made) > (now_ms.max(0) as u64).saturating_add(UUIDV7_AHEAD.as_millis() as u64)
}

/// A fresh random key (check key or filter key) from the OS CSPRNG.
pub fn new_key() -> anyhow::Result<Zeroizing<Vec<u8>>> {
    let mut key = Zeroizing::new(vec![0u8; KEY_BYTES]);
    getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("the OS random source failed: {e}"))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Format, OsRandom, crockford_decode_16};

    fn keys(versions: &[(u8, i64)]) -> CheckKeys {
        let stored: Vec<StoredCheckKey> = versions
            .iter()
            .map(|&(version, created_at_ms)| StoredCheckKey { version, key: new_key().unwrap(), created_at_ms })
            .collect();
        CheckKeys::new(&stored).unwrap()
    }

    fn gate(keys: CheckKeys, legacy: Legacy) -> Gate {
        Gate::new(GateState { keys, legacy, filter_version: (0, true) })
    }

    /// A UUIDv7 dated more than a minute ahead is forged, refused in memory; one dated now is
    /// read (before, one from the future was read, and never counted as old enough to be a
    /// final miss).
    #[test]
    fn a_uuidv7_from_the_future_is_forged() {
        let gate = gate(keys(&[(1, 0)]), Legacy::Open);
        let now = idgen::system_unix_ms();
        let dated = |ms: i64| {
            let mut bytes = [0x70u8; 16];
            bytes[..6].copy_from_slice(&(ms as u64).to_be_bytes()[2..]);
            bytes
        };
        assert_eq!(gate.judge(Format::Uuidv7, &dated(now), None), Verdict::Unchecked);
        assert_eq!(gate.judge(Format::Uuidv7, &dated(now + 30_000), None), Verdict::Unchecked, "within the skew");
        assert_eq!(gate.judge(Format::Uuidv7, &dated(now + 3_600_000), None), Verdict::Forged);
        assert_eq!(gate.judge(Format::Uuidv7, &[0xff; 16], None), Verdict::Forged, "the year 10889");
    }

    /// An ID of a key version newer than every known one is forged while the keys are fresh,
    /// and read (a reload asked for) once they are stale: an instance whose reloads failed past
    /// a rotation never answers 404 for a genuine new ID.
    #[tokio::test]
    async fn a_newer_version_is_forged_while_the_keys_are_fresh_and_read_once_they_are_stale() {
        let stored: Vec<StoredCheckKey> =
            (1..=2).map(|version| StoredCheckKey { version, key: new_key().unwrap(), created_at_ms: 0 }).collect();
        let both = CheckKeys::new(&stored).unwrap();
        let made = crockford_decode_16(&both.new_opaque(&OsRandom, None, 1_000_000).unwrap()).unwrap();
        assert_eq!(made[0], 2, "made under the newer key");
        let sealed = Legacy::Sealed(Box::new(LegacyFilter::sized(&[7; 32], 10)));
        let old = gate(CheckKeys::new(&stored[..1]).unwrap(), sealed);
        assert_eq!(old.judge(Format::Opaque, &made, None), Verdict::Forged, "fresh keys");
        old.loaded_at(std::time::Instant::now() - STALE_AFTER - Duration::from_secs(1));
        assert_eq!(old.judge(Format::Opaque, &made, None), Verdict::StaleKeys);
        tokio::time::timeout(Duration::from_secs(1), old.reload_asked()).await.expect("a reload was asked for");
        let mut known = made;
        known[0] = 1;
        assert_eq!(old.judge(Format::Opaque, &known, None), Verdict::Forged, "a known version's bad tag");
        old.replace(GateState { keys: both, ..(*old.state()).clone() });
        assert_eq!(old.judge(Format::Opaque, &made, None), Verdict::Tagged, "reloaded");
    }

    /// A made ID passes its own check, with its own type only; a random one fails it.
    #[test]
    fn made_ids_pass_and_random_ones_fail() {
        let gate = gate(keys(&[(1, 0)]), Legacy::Sealed(Box::new(LegacyFilter::sized(b"k", 0))));
        for type_number in [None, Some(1), Some(32767)] {
            let text = gate.new_opaque(&OsRandom, type_number, 0).unwrap();
            let bytes = crockford_decode_16(&text).unwrap();
            assert_eq!(bytes[0], 1, "the key version leads");
            assert_eq!(gate.judge(Format::Opaque, &bytes, type_number), Verdict::Tagged);
            for other in [None, Some(2)].into_iter().filter(|o| *o != type_number) {
                assert_eq!(gate.judge(Format::Opaque, &bytes, other), Verdict::Forged, "{type_number:?} as {other:?}");
            }
            let mut flipped = bytes;
            flipped[5] ^= 1;
            assert_eq!(gate.judge(Format::Opaque, &flipped, type_number), Verdict::Forged);
        }
        let mut passed = 0;
        for _ in 0..100_000 {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).unwrap();
            bytes[0] = 1;
            passed += usize::from(gate.judge(Format::Opaque, &bytes, None) != Verdict::Forged);
        }
        assert_eq!(passed, 0, "random IDs with the right version byte passed the 32-bit tag");
        assert_eq!(gate.judge(Format::Uuidv7, &[0; 16], None), Verdict::Unchecked);
    }

    /// Another deployment's key (or a key never stored) does not verify.
    #[test]
    fn another_key_does_not_verify() {
        let ours = keys(&[(1, 0)]);
        let theirs = keys(&[(1, 0)]);
        let text = theirs.new_opaque(&OsRandom, None, 0).unwrap();
        assert!(!ours.verifies(&crockford_decode_16(&text).unwrap(), None));
    }

    /// A new version is used only after the rotation delay; older ones keep verifying.
    #[test]
    fn a_new_version_waits_for_every_instance() {
        let delay = ROTATION_DELAY.as_millis() as i64;
        let keys = keys(&[(1, 1_000), (2, 10_000)]);
        assert_eq!(keys.current(1_000), 1, "the lowest version at once");
        assert_eq!(keys.current(10_000 + delay - 1), 1);
        assert_eq!(keys.current(10_000 + delay), 2);
        let old = crockford_decode_16(&keys.new_opaque(&OsRandom, None, 0).unwrap()).unwrap();
        let new = crockford_decode_16(&keys.new_opaque(&OsRandom, None, 10_000 + delay).unwrap()).unwrap();
        assert_eq!((old[0], new[0]), (1, 2));
        assert!(keys.verifies(&old, None) && keys.verifies(&new, None));
    }

    /// The legacy filter holds every ID put in it, and about 1 in 2,048 of others; an open one lets
    /// every untagged ID be read.
    #[test]
    fn the_legacy_filter_holds_old_ids_and_few_others() {
        let mut filter = LegacyFilter::sized(&new_key().unwrap(), 10_000);
        let old: Vec<[u8; 16]> = (0..10_000).map(|_| rand_bytes()).collect();
        for id in &old {
            filter.insert(id);
        }
        let gate = gate(keys(&[(1, 0)]), Legacy::Sealed(Box::new(filter.clone())));
        assert!(old.iter().all(|id| gate.judge(Format::Opaque, id, None) == Verdict::Legacy));
        let others = (0..200_000).filter(|_| filter.contains(&rand_bytes())).count();
        assert!((30..=200).contains(&others), "{others} of 200,000 random IDs in a 1/2,048 filter (about 98)");
        let stored = LegacyFilter::from_parts(b"", filter.hashes(), filter.bits().to_vec());
        assert!(!old.iter().all(|id| stored.contains(id)), "another hash key finds other positions");
        let open = self::gate(keys(&[(1, 0)]), Legacy::Open);
        assert_eq!(open.judge(Format::Opaque, &rand_bytes(), None), Verdict::Legacy);
    }

    fn rand_bytes() -> [u8; 16] {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).unwrap();
        bytes
    }
}
