//! Per-caller quotas in IDs per second with a burst (GCRA, the `governor` crate), a batch of N
//! counting N. Listed callers have their own limiter; every caller not listed gets the default
//! quota on a keyed limiter (a sharded map), so no caller waits on another's lock. The set in
//! force is replaced on reload.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::bail;
use arc_swap::ArcSwap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::Caller;

/// `{ ids_per_second = …, burst = … }`.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// IDs per second, sustained (at least 1).
    pub ids_per_second: u32,
    /// IDs that may be taken at once above the rate (at least 1).
    pub burst: u32,
}

/// `[quotas]`: `default` for callers not listed, `[quotas.callers] orders = { … }`. Without a
/// section, or without `default`, callers not listed are not limited.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct QuotaSection {
    /// The rate of every caller not listed in `callers`; without it they are not limited.
    pub default: Option<Rate>,
    /// A rate per caller identity: `[quotas.callers] "spiffe://…/orders" = { ids_per_second = …, burst = … }`.
    #[serde(default)]
    pub callers: BTreeMap<String, Rate>,
}

impl Rate {
    fn quota(&self, what: &str) -> anyhow::Result<Quota> {
        let (Some(rate), Some(burst)) = (NonZeroU32::new(self.ids_per_second), NonZeroU32::new(self.burst)) else {
            bail!("{what}: ids_per_second and burst must both be at least 1");
        };
        Ok(Quota::per_second(rate).allow_burst(burst))
    }
}

impl QuotaSection {
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(default) = &self.default {
            default.quota("quotas.default")?;
        }
        for (caller, rate) in &self.callers {
            rate.quota(&format!("quotas.callers.{caller}"))?;
        }
        Ok(())
    }
}

/// A caller over quota: the answer is 429 with this `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverQuota {
    pub caller: String,
    pub retry_after_secs: u64,
    pub message: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallerLabel {
    caller: String,
}

/// IDs served and requests throttled, by caller: the listed callers and `other`.
#[derive(Default)]
pub struct QuotaMetrics {
    served: Family<CallerLabel, Counter>,
    throttled: Family<CallerLabel, Counter>,
}

impl QuotaMetrics {
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register(
            "idgen_caller_ids_served",
            "IDs served, by caller (listed callers, else other)",
            self.served.clone(),
        );
        registry.register(
            "idgen_caller_requests_throttled",
            "Requests refused over quota (429), by caller (listed callers, else other)",
            self.throttled.clone(),
        );
    }
}

/// One label's counters, and when a refusal was last logged (at most once a second per label).
struct Accounting {
    served: Counter,
    throttled: Counter,
    last_logged_s: AtomicU64,
}

impl Accounting {
    fn new(metrics: &QuotaMetrics, label: &str) -> Self {
        let label = CallerLabel { caller: label.to_owned() };
        Accounting {
            served: metrics.served.get_or_create(&label).clone(),
            throttled: metrics.throttled.get_or_create(&label).clone(),
            last_logged_s: AtomicU64::new(0),
        }
    }
}

struct Listed {
    limiter: DefaultDirectRateLimiter,
    rate: Rate,
    accounting: Accounting,
}

/// The buckets of callers not listed, one per caller, under one rate.
struct Unlisted {
    limiter: DefaultKeyedRateLimiter<Arc<str>>,
    rate: Rate,
}

/// The quotas in force. A reload keeps the bucket (the limiter, as it has been drained) of every
/// caller whose rate it does not change, so a SIGHUP never hands every caller a fresh burst.
struct QuotaSet {
    listed: HashMap<String, Arc<Listed>>,
    default: Option<Arc<Unlisted>>,
    other: Arc<Accounting>,
}

pub struct Quotas {
    current: ArcSwap<QuotaSet>,
    metrics: Arc<QuotaMetrics>,
}

impl Quotas {
    pub fn new(section: &QuotaSection, metrics: Arc<QuotaMetrics>) -> anyhow::Result<Quotas> {
        let set = build(section, &metrics, None)?;
        Ok(Quotas { current: ArcSwap::from_pointee(set), metrics })
    }

    /// Takes a new section; on an invalid one the quotas in force stay. A caller whose rate it
    /// leaves as it was keeps its bucket as it is; a changed or new rate starts full.
    pub fn reload(&self, section: &QuotaSection) -> anyhow::Result<()> {
        let fresh = build(section, &self.metrics, Some(&self.current.load()))?;
        self.current.store(Arc::new(fresh));
        Ok(())
    }

    /// Admits `n` IDs for `caller`, or says when to come back.
    pub fn admit(&self, caller: &Caller, n: u32) -> Result<(), OverQuota> {
        self.take(caller, n.max(1), n.max(1))
    }

    /// Admits the rest of a request for `n` IDs whose first was admitted (by [`Quotas::admit`]
    /// with 1) before its body was read: a body sent slowly, or a byte a frame, costs its caller
    /// quota like any request before it costs the service the time to read it.
    pub fn admit_rest(&self, caller: &Caller, n: u32) -> Result<(), OverQuota> {
        self.take(caller, n.max(1), n.saturating_sub(1))
    }

    /// Draws `drawn` from `caller`'s bucket for a request of `asked` IDs (refused whole if more
    /// than the burst).
    fn take(&self, caller: &Caller, asked: u32, drawn: u32) -> Result<(), OverQuota> {
        let set = self.current.load();
        let name = caller.name();
        let listed = set.listed.get(name);
        let (burst, accounting) = match (listed, &set.default) {
            (Some(listed), _) => (listed.rate.burst, &listed.accounting),
            (None, Some(default)) => (default.rate.burst, &*set.other),
            (None, None) => return Ok(()),
        };
        let too_many = || OverQuota {
            caller: name.to_owned(),
            retry_after_secs: 1,
            message: format!(
                "a request for {asked} IDs is more than caller {name}'s burst of {burst}: ask for at most {burst} at a time"
            ),
        };
        let checked = match (NonZeroU32::new(drawn), asked > burst) {
            (_, true) => Err(too_many()),
            (None, false) => return Ok(()),
            (Some(n), false) => match (listed, &set.default) {
                (Some(listed), _) => listed.limiter.check_n(n),
                (None, Some(default)) => default.limiter.check_key_n(caller.key(), n),
                (None, None) => return Ok(()),
            }
            .map_err(|_| too_many()),
        };
        let refused = match checked {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                let retry_after_secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                OverQuota {
                    caller: name.to_owned(),
                    retry_after_secs: retry_after_secs.max(1),
                    message: format!("caller {name} is over its quota: retry in {} s", retry_after_secs.max(1)),
                }
            }
            Err(too_many) => too_many,
        };
        accounting.throttled.inc();
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last = accounting.last_logged_s.load(Ordering::Relaxed);
        if now_s > last
            && accounting.last_logged_s.compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(
                caller = name,
                retry_after_s = refused.retry_after_secs,
                "over quota: refusing (429); logged at most once a second per caller"
            );
        }
        Err(refused)
    }

    /// Counts `n` IDs served to `caller`.
    pub fn served(&self, caller: &Caller, n: u32) {
        let set = self.current.load();
        let accounting = set.listed.get(caller.name()).map_or(&*set.other, |listed| &listed.accounting);
        accounting.served.inc_by(u64::from(n));
    }
}

/// The quotas of `section`, keeping from `previous` every bucket whose rate is unchanged.
fn build(section: &QuotaSection, metrics: &QuotaMetrics, previous: Option<&QuotaSet>) -> anyhow::Result<QuotaSet> {
    section.validate()?;
    let mut listed = HashMap::new();
    for (caller, rate) in &section.callers {
        let kept = previous.and_then(|p| p.listed.get(caller)).filter(|l| l.rate == *rate);
        let entry = match kept {
            Some(kept) => kept.clone(),
            None => Arc::new(Listed {
                limiter: DefaultDirectRateLimiter::direct(rate.quota(&format!("quotas.callers.{caller}"))?),
                rate: *rate,
                accounting: Accounting::new(metrics, caller),
            }),
        };
        listed.insert(caller.clone(), entry);
    }
    let default = match &section.default {
        Some(rate) => match previous.and_then(|p| p.default.clone()).filter(|d| d.rate == *rate) {
            Some(kept) => Some(kept),
            None => Some(Arc::new(Unlisted {
                limiter: DefaultKeyedRateLimiter::dashmap(rate.quota("quotas.default")?),
                rate: *rate,
            })),
        },
        None => None,
    };
    let other = previous.map_or_else(|| Arc::new(Accounting::new(metrics, "other")), |p| p.other.clone());
    Ok(QuotaSet { listed, default, other })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas() -> Quotas {
        let section = QuotaSection {
            default: Some(Rate { ids_per_second: 10, burst: 5 }),
            callers: BTreeMap::from([("orders".to_owned(), Rate { ids_per_second: 1_000, burst: 1_000 })]),
        };
        Quotas::new(&section, Arc::default()).unwrap()
    }

    #[test]
    fn a_batch_counts_its_size_and_refusals_say_when_to_come_back() {
        let quotas = quotas();
        let orders = Caller::named("orders");
        assert_eq!(quotas.admit(&orders, 1_000), Ok(()), "a full burst");
        let refused = quotas.admit(&orders, 1_000).unwrap_err();
        assert!(refused.retry_after_secs >= 1, "{refused:?}");
        assert!(quotas.admit(&orders, 1_001).unwrap_err().message.contains("more than caller orders's burst"));
    }

    /// One unit before the body, the rest after: a batch costs its size in all, and one over the
    /// burst is refused whole.
    #[test]
    fn a_request_charged_before_its_body_pays_the_rest_after() {
        // One ID a second: nothing comes back while the test runs.
        let section = QuotaSection { default: Some(Rate { ids_per_second: 1, burst: 5 }), callers: BTreeMap::new() };
        let quotas = Quotas::new(&section, Arc::default()).unwrap();
        let (a, orders) = (Caller::named("a"), Caller::named("a-batch"));
        quotas.admit(&a, 1).unwrap();
        assert_eq!(quotas.admit_rest(&a, 1), Ok(()), "a request for one paid before its body");
        quotas.admit(&orders, 1).unwrap();
        assert_eq!(quotas.admit_rest(&orders, 5), Ok(()), "a request for 5: 1 before its body, 4 after");
        assert!(quotas.admit(&orders, 1).is_err(), "1 + 4: the burst of 5 is used up");
        let b = Caller::named("b");
        quotas.admit(&b, 1).unwrap();
        let refused = quotas.admit_rest(&b, 6).unwrap_err();
        assert!(refused.message.contains("a request for 6 IDs is more than caller b's burst of 5"), "{refused:?}");
        assert_eq!(quotas.admit(&b, 4), Ok(()), "a refused rest drew nothing");
    }

    #[test]
    fn callers_not_listed_each_get_the_default_and_do_not_share_it() {
        let quotas = quotas();
        let (a, b) = (Caller::named("a"), Caller::named("b"));
        for _ in 0..5 {
            quotas.admit(&a, 1).unwrap();
        }
        assert!(quotas.admit(&a, 1).is_err(), "a's burst of 5 is used up");
        assert_eq!(quotas.admit(&b, 5), Ok(()), "b has its own");
        let unlimited = Quotas::new(&QuotaSection::default(), Arc::default()).unwrap();
        assert_eq!(unlimited.admit(&a, 1_000_000), Ok(()), "no section: no limit");
    }

    #[test]
    fn a_reload_replaces_the_quotas_and_a_bad_one_keeps_them() {
        let quotas = quotas();
        let a = Caller::named("a");
        let tight = QuotaSection { default: Some(Rate { ids_per_second: 1, burst: 1 }), callers: BTreeMap::new() };
        quotas.reload(&tight).unwrap();
        quotas.admit(&a, 1).unwrap();
        assert!(quotas.admit(&a, 1).is_err());
        let bad = QuotaSection { default: Some(Rate { ids_per_second: 0, burst: 1 }), callers: BTreeMap::new() };
        assert!(quotas.reload(&bad).is_err());
        assert!(quotas.admit(&a, 1).is_err(), "still the tight one");
    }

    /// A reload (SIGHUP) that leaves a caller's rate as it was keeps its bucket as it
    /// is, drained; one that changes it starts it full.
    #[test]
    fn a_reload_keeps_the_buckets_of_rates_it_does_not_change() {
        let quotas = quotas();
        let (orders, a) = (Caller::named("orders"), Caller::named("a"));
        quotas.admit(&orders, 1_000).unwrap();
        quotas.admit(&a, 5).unwrap();
        assert!(quotas.admit(&orders, 10).is_err() && quotas.admit(&a, 1).is_err(), "both drained");
        let same = QuotaSection {
            default: Some(Rate { ids_per_second: 10, burst: 5 }),
            callers: BTreeMap::from([("orders".to_owned(), Rate { ids_per_second: 1_000, burst: 1_000 })]),
        };
        quotas.reload(&same).unwrap();
        assert!(quotas.admit(&orders, 10).is_err(), "a reload gave orders a fresh burst");
        assert!(quotas.admit(&a, 1).is_err(), "a reload gave a caller not listed a fresh burst");
        let raised = QuotaSection {
            callers: BTreeMap::from([("orders".to_owned(), Rate { ids_per_second: 2_000, burst: 2_000 })]),
            ..same
        };
        quotas.reload(&raised).unwrap();
        quotas.admit(&orders, 2_000).unwrap();
    }
}
