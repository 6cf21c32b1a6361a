//! Property tests for the pure core (SPEC §1–§3): layouts and the schedule, timestamp formatting,
//! the generator's clock and fence rules, and UUIDv7.
//!
//! Every expectation is computed here from the spec's wording (shift-and-or formulas, a naive
//! calendar, a small model of the generator's rules), not by calling the code under test twice.

use idgen_core::uuid::{self, UuidV7State};
use idgen_core::{
    DEFAULT_V2_FROM, EPOCH_UNIX_MS, Generator, GeneratorConfig, Layout, Lease, MAX_TIMESTAMP, NotNow, OPEN_HORIZON,
    Refusal, Schedule, ScheduleEntry, Timestamp, WaitCause, format_unix_ms,
};
use proptest::prelude::*;

/// `cases` random cases; failures are printed (shrunk), not persisted: an integration test has
/// no `lib.rs` next to it for proptest's regression files.
fn cases(cases: u32) -> ProptestConfig {
    ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(cases) }
}

fn default_schedule() -> Schedule {
    Schedule::default_with_horizon(OPEN_HORIZON).unwrap()
}

/// `(ts << 22) | (region << (machine_bits + sequence_bits)) | (machine << sequence_bits) | seq`,
/// written out independently of `Layout::encode`.
fn formula(ts: u64, region: u32, machine: u32, seq: u32, machine_bits: u8, sequence_bits: u8) -> u64 {
    (ts << 22)
        | (u64::from(region) << (machine_bits + sequence_bits))
        | (u64::from(machine) << sequence_bits)
        | u64::from(seq)
}

fn encode(layout: &Layout, ts: u64, region: u32, machine: u32, seq: u32) -> u64 {
    layout
        .encode(
            Timestamp::from_millis(ts).unwrap(),
            layout.region_number(region).unwrap(),
            layout.machine_number(machine).unwrap(),
            layout.sequence(seq).unwrap(),
        )
        .unwrap()
}

/// A valid third layout: region + machine + sequence = 22 bits, machine and sequence ≥ 1 bit.
fn arb_layout() -> impl Strategy<Value = Layout> {
    (0u8..=20)
        .prop_flat_map(|region| (Just(region), 1u8..=(21 - region)))
        .prop_map(|(region, machine)| Layout::new("v3", region, machine, 22 - region - machine).unwrap())
}

/// v1 from the epoch, v2 from 2028, and a random v3 from a random later timestamp.
fn arb_three_layout_schedule() -> impl Strategy<Value = (Schedule, Layout, u64)> {
    (arb_layout(), (DEFAULT_V2_FROM + 1)..=MAX_TIMESTAMP).prop_map(|(v3, from)| {
        let mut entries = default_schedule().entries().to_vec();
        entries.push(ScheduleEntry { layout: v3.clone(), from: Timestamp::from_millis(from).unwrap() });
        (Schedule::new(entries, OPEN_HORIZON).unwrap(), v3, from)
    })
}

fn max_of(bits: u8) -> u32 {
    ((1u64 << bits) - 1) as u32
}

/// Re-encodes a decoded ID from its fields with the layout it decoded as.
fn re_encode(schedule: &Schedule, id: u64) -> u64 {
    let d = schedule.decode(id).unwrap();
    encode(&d.layout, d.timestamp.millis(), d.region_number.unwrap_or(0), d.machine, d.sequence)
}

// ---------------------------------------------------------------------------------------------
// §1: layouts, encode and decode
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn v1_round_trip(ts in 0..DEFAULT_V2_FROM, machine in 0u32..=1023, seq in 0u32..=4095) {
        let v1 = Layout::v1();
        let id = encode(&v1, ts, 0, machine, seq);
        prop_assert_eq!(id, formula(ts, 0, machine, seq, 10, 12));
        prop_assert_eq!(id >> 63, 0);
        prop_assert_eq!(v1.decode_fields(id), (0, machine, seq));
        let d = default_schedule().decode(id).unwrap();
        prop_assert_eq!(d.layout.name(), "v1");
        prop_assert_eq!(d.timestamp.millis(), ts);
        prop_assert_eq!(d.timestamp.unix_ms(), ts as i64 + EPOCH_UNIX_MS);
        prop_assert_eq!((d.region_number, d.machine, d.sequence, d.id), (None, machine, seq, id));
    }

    #[test]
    fn v2_round_trip(ts in DEFAULT_V2_FROM..=MAX_TIMESTAMP, region in 0u32..=7, machine in 0u32..=511, seq in 0u32..=1023) {
        let v2 = Layout::v2();
        let id = encode(&v2, ts, region, machine, seq);
        prop_assert_eq!(id, formula(ts, region, machine, seq, 9, 10));
        prop_assert_eq!(id >> 63, 0);
        prop_assert_eq!(v2.decode_fields(id), (region, machine, seq));
        let d = default_schedule().decode(id).unwrap();
        prop_assert_eq!(d.layout.name(), "v2");
        prop_assert_eq!(d.timestamp.millis(), ts);
        prop_assert_eq!((d.region_number, d.machine, d.sequence, d.id), (Some(region), machine, seq, id));
    }

    /// Field widths are enforced at the edges, for both built-in layouts, anywhere in the range.
    #[test]
    fn fields_fit_exactly_their_bits(ts in 0..=MAX_TIMESTAMP) {
        for layout in [Layout::v1(), Layout::v2()] {
            let (r, m, s) = (layout.region_bits(), layout.machine_bits(), layout.sequence_bits());
            prop_assert_eq!(u32::from(r) + u32::from(m) + u32::from(s), 22);
            let top = encode(&layout, ts, max_of(r), max_of(m), max_of(s));
            prop_assert_eq!(top, (ts << 22) | ((1 << 22) - 1));
            prop_assert_eq!(encode(&layout, ts, 0, 0, 0), ts << 22);
            prop_assert!(layout.machine_number(max_of(m) + 1).is_err());
            prop_assert!(layout.sequence(max_of(s) + 1).is_err());
            prop_assert!(layout.region_number(max_of(r) + 1).is_err());
            prop_assert_eq!(layout.sequences_per_ms(), max_of(s) + 1);
            prop_assert_eq!(layout.max_machine(), max_of(m));
            prop_assert_eq!(layout.max_region(), max_of(r));
        }
    }

    #[test]
    fn third_layout_round_trip(
        (schedule, v3, from) in arb_three_layout_schedule(),
        offset in any::<u64>(),
        fields in any::<(u32, u32, u32)>(),
    ) {
        let ts = from + offset % (MAX_TIMESTAMP - from + 1);
        let (r, m, s) = (v3.region_bits(), v3.machine_bits(), v3.sequence_bits());
        let (region, machine, seq) = (fields.0 & max_of(r), fields.1 & max_of(m), fields.2 & max_of(s));
        let id = encode(&v3, ts, region, machine, seq);
        prop_assert_eq!(id, formula(ts, region, machine, seq, m, s));
        let d = schedule.decode(id).unwrap();
        prop_assert_eq!(d.layout.name(), "v3");
        prop_assert_eq!(d.timestamp.millis(), ts);
        prop_assert_eq!(d.region_number, (r > 0).then_some(region));
        prop_assert_eq!((d.machine, d.sequence), (machine, seq));
        // The millisecond before the cutover still belongs to v2.
        let before = schedule.decode((from - 1) << 22).unwrap();
        prop_assert_eq!(before.layout.name(), "v2");
    }

    /// Decoding any 63-bit integer never panics, picks the layout by timestamp and re-encodes to
    /// the same integer; anything with bit 63 set is rejected.
    #[test]
    fn any_63_bit_integer_decodes_and_re_encodes(
        id in 0u64..(1 << 63),
        high in (1u64 << 63)..=u64::MAX,
        (schedule, _, _) in arb_three_layout_schedule(),
    ) {
        for schedule in [default_schedule(), schedule] {
            let d = schedule.decode(id).unwrap();
            prop_assert_eq!(d.id, id);
            prop_assert_eq!(d.timestamp.millis(), id >> 22);
            let expected = schedule.entries().iter().rev().find(|e| e.from.millis() <= id >> 22).unwrap();
            prop_assert_eq!(d.layout.name(), expected.layout.name());
            prop_assert_eq!(re_encode(&schedule, id), id);
            prop_assert!(schedule.decode(high).is_err());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Time formatting against a naive calendar
// ---------------------------------------------------------------------------------------------

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Days since 1970-01-01 to (year, month, day), by walking whole years and months.
fn naive_civil(mut days: i64) -> (i64, u32, u32) {
    let mut year = 1970;
    while days < 0 {
        year -= 1;
        days += if is_leap(year) { 366 } else { 365 };
    }
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let months = [31, if is_leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 0;
    while days >= months[month] {
        days -= months[month];
        month += 1;
    }
    (year, month as u32 + 1, days as u32 + 1)
}

fn naive_format(unix_ms: i64) -> String {
    let (y, mo, d) = naive_civil(unix_ms.div_euclid(86_400_000));
    let rem = unix_ms.rem_euclid(86_400_000);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z in Unix ms.
const YEAR_0: i64 = -62_167_219_200_000;
const YEAR_9999_END: i64 = 253_402_300_799_999;

#[test]
fn format_known_anchors() {
    let anchors = [
        (0, "1970-01-01T00:00:00.000Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        (EPOCH_UNIX_MS, "2026-01-01T00:00:00.000Z"),
        (1_790_424_000_000, "2026-09-26T12:00:00.000Z"),
        (EPOCH_UNIX_MS + DEFAULT_V2_FROM as i64, "2028-01-01T00:00:00.000Z"),
        (EPOCH_UNIX_MS + DEFAULT_V2_FROM as i64 - 1, "2027-12-31T23:59:59.999Z"),
        (Timestamp::MAX.unix_ms(), "2095-09-07T15:47:35.551Z"),
        (4_102_444_800_000, "2100-01-01T00:00:00.000Z"),
        (YEAR_0, "0000-01-01T00:00:00.000Z"),
        (YEAR_9999_END, "9999-12-31T23:59:59.999Z"),
    ];
    for (ms, text) in anchors {
        assert_eq!(format_unix_ms(ms), text, "{ms}");
        assert_eq!(naive_format(ms), text, "the naive calendar itself, {ms}");
    }
}

proptest! {
    #![proptest_config(cases(256))]
    #[test]
    fn format_agrees_with_a_naive_calendar(ms in YEAR_0..=YEAR_9999_END) {
        prop_assert_eq!(format_unix_ms(ms), naive_format(ms));
    }

    /// In the ID range the text has a fixed length and sorts like the number.
    #[test]
    fn format_is_fixed_width_and_ordered(a in 0..=MAX_TIMESTAMP, b in 0..=MAX_TIMESTAMP) {
        let (ta, tb) = (Timestamp::from_millis(a).unwrap().unix_ms(), Timestamp::from_millis(b).unwrap().unix_ms());
        let (fa, fb) = (format_unix_ms(ta), format_unix_ms(tb));
        prop_assert_eq!(fa.len(), 24);
        prop_assert_eq!(fb.len(), 24);
        prop_assert_eq!(a.cmp(&b), fa.cmp(&fb));
        // One millisecond later is the next text (or the same second rolled over).
        let next = format_unix_ms(ta + 1);
        prop_assert!(next > fa);
    }

    #[test]
    fn format_never_panics(ms in any::<i64>()) {
        let text = format_unix_ms(ms);
        prop_assert!(text.ends_with('Z'));
    }
}

// ---------------------------------------------------------------------------------------------
// §2–§3: one generator against a model of the rules
// ---------------------------------------------------------------------------------------------

const V2_FROM_UNIX_MS: i64 = EPOCH_UNIX_MS + DEFAULT_V2_FROM as i64;
const LAYOUTS: [&str; 2] = ["v1", "v2"];

#[derive(Debug, Clone)]
enum Op {
    /// The clock moves by `dt` ms, then the caller asks for `want` IDs.
    Issue {
        dt: i64,
        want: u32,
    },
    /// The clock jumps to `offset` ms from a boundary of the rules, then the caller asks for IDs:
    /// that is where an off-by-one would hide.
    IssueNear {
        anchor: Anchor,
        offset: i64,
        want: u32,
    },
    /// A claim at the current clock reading: floor = now, expiry = now + lease_ms.
    Claim {
        layout: usize,
        machine: u32,
        lease_ms: i64,
    },
    /// A renewal moving the expiry by `by` (≤ 0 must be rejected), optionally with a wrong epoch.
    Extend {
        layout: usize,
        by: i64,
        wrong_epoch: bool,
    },
    Drop {
        layout: usize,
    },
    Release {
        layout: usize,
    },
    Sync(bool),
}

fn arb_dt() -> impl Strategy<Value = i64> {
    prop_oneof![
        30 => 0i64..=2,
        4 => -5i64..=-1,
        2 => -40i64..=-6,
        1 => -1_500i64..=-50,
        4 => 20i64..=800,
    ]
}

fn arb_want() -> impl Strategy<Value = u32> {
    prop_oneof![6 => 0u32..=20, 3 => 21u32..=1_500, 1 => 1_500u32..=6_000]
}

#[derive(Debug, Clone, Copy)]
enum Anchor {
    /// The last issued timestamp (the 5 ms rule).
    Last,
    /// The floor of the lease in force (the claim's `:now`).
    Floor,
    /// `lease_expiry − fence` of the lease in force.
    Fence,
    /// The v2 cutover.
    Cutover,
    /// The schedule's horizon.
    Horizon,
}

fn arb_anchor() -> impl Strategy<Value = Anchor> {
    prop_oneof![
        3 => Just(Anchor::Last),
        2 => Just(Anchor::Floor),
        3 => Just(Anchor::Fence),
        1 => Just(Anchor::Cutover),
        1 => Just(Anchor::Horizon),
    ]
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (arb_dt(), arb_want()).prop_map(|(dt, want)| Op::Issue { dt, want }),
        8 => (arb_anchor(), -12i64..=3, arb_want()).prop_map(|(anchor, offset, want)| Op::IssueNear { anchor, offset, want }),
        3 => (0usize..2, 0u32..=1023, 200i64..=6_000).prop_map(|(layout, machine, lease_ms)| Op::Claim { layout, machine, lease_ms }),
        6 => (0usize..2, -200i64..=3_000, prop::bool::weighted(0.1)).prop_map(|(layout, by, wrong_epoch)| Op::Extend { layout, by, wrong_epoch }),
        1 => (0usize..2).prop_map(|layout| Op::Drop { layout }),
        1 => (0usize..2).prop_map(|layout| Op::Release { layout }),
        1 => prop::bool::weighted(0.85).prop_map(Op::Sync),
    ]
}

/// Where the clock starts: an ordinary day, near the v2 cutover, near the end of the 41 bits, or
/// just before the epoch.
fn arb_start() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => EPOCH_UNIX_MS..(EPOCH_UNIX_MS + 5 * 365 * 86_400_000),
        3 => (V2_FROM_UNIX_MS - 3_000)..(V2_FROM_UNIX_MS + 3_000),
        1 => (Timestamp::MAX.unix_ms() - 3_000)..=Timestamp::MAX.unix_ms(),
        1 => (EPOCH_UNIX_MS - 3_000)..(EPOCH_UNIX_MS + 3_000),
    ]
}

#[derive(Debug, Clone)]
struct ModelLease {
    machine: u32,
    epoch: u64,
    floor: i64,
    expiry: i64,
    last_issued: Option<i64>,
}

/// What the spec says the generator knows, kept by the test.
#[derive(Debug)]
struct Model {
    fence_ms: i64,
    max_wait: i64,
    region: u32,
    home: bool,
    horizon_unix_ms: i64,
    unsynchronized: bool,
    leases: [Option<ModelLease>; 2],
    last: Option<i64>,
    /// Next free sequence in `last`; `None` once a new lease made the millisecond unusable.
    next_seq: Option<u32>,
    last_id: Option<u64>,
}

impl Model {
    fn layout_at(now: i64) -> usize {
        usize::from(now >= V2_FROM_UNIX_MS)
    }

    /// Checks one `issue(now, want)` outcome against the rules. Returns a description of the first
    /// inconsistency, if any. Updates the model on success.
    fn check(&mut self, now: i64, want: u32, outcome: &Result<idgen_core::Run, NotNow>) -> Result<(), String> {
        let per_ms = |l: usize| if l == 0 { 4096 } else { 1024 };
        let in_range = (EPOCH_UNIX_MS..=Timestamp::MAX.unix_ms()).contains(&now);
        let layout = Self::layout_at(now);
        let lease = self.leases[layout].as_ref();
        // How far behind each bound the clock is (positive = behind).
        let behind_last = self.last.map(|l| l - now).filter(|b| *b > 0);
        let behind_floor = lease.map(|l| l.floor - now).filter(|b| *b > 0);
        match outcome {
            Ok(run) => {
                let lease = lease.ok_or("issued without a lease")?;
                if self.unsynchronized {
                    return Err("issued with an unsynchronized clock".into());
                }
                if behind_last.is_some() || behind_floor.is_some() {
                    return Err(format!("issued at {now}, behind last {:?} / floor {}", self.last, lease.floor));
                }
                if !in_range || now >= self.horizon_unix_ms {
                    return Err("issued out of range or past the horizon".into());
                }
                if layout == 0 && !self.home {
                    return Err("issued v1 outside the home region".into());
                }
                if now >= lease.expiry - self.fence_ms {
                    return Err(format!(
                        "issued at {now} inside the fence (expiry {}, fence {})",
                        lease.expiry, self.fence_ms
                    ));
                }
                let seq = if self.last == Some(now) {
                    self.next_seq.ok_or("reused a millisecond after a new lease")?
                } else {
                    0
                };
                if seq >= per_ms(layout) {
                    return Err("issued past the end of the sequence".into());
                }
                let count = want.max(1).min(per_ms(layout) - seq);
                let ts = (now - EPOCH_UNIX_MS) as u64;
                let first = if layout == 0 {
                    formula(ts, 0, lease.machine, seq, 10, 12)
                } else {
                    formula(ts, self.region, lease.machine, seq, 9, 10)
                };
                let expected = idgen_core::Run { first, count, unix_ms: now, machine: lease.machine };
                if *run != expected {
                    return Err(format!("run {run:?}, expected {expected:?}"));
                }
                if self.last_id.is_some_and(|last| first <= last) {
                    return Err(format!("ID {first} not above the previous {:?}", self.last_id));
                }
                self.last = Some(now);
                self.next_seq = Some(seq + count);
                self.last_id = Some(first + u64::from(count) - 1);
                self.leases[layout].as_mut().unwrap().last_issued = Some(now);
                Ok(())
            }
            Err(NotNow::Wait { until_unix_ms, cause: WaitCause::ClockBehind }) => {
                let bounds = [self.last, lease.map(|l| l.floor)];
                let ok =
                    bounds.iter().flatten().any(|b| b == until_unix_ms && (1..=self.max_wait).contains(&(b - now)));
                if ok && !self.unsynchronized {
                    Ok(())
                } else {
                    Err(format!("wait until {until_unix_ms} at {now} ({bounds:?})"))
                }
            }
            Err(NotNow::Wait { until_unix_ms, cause: WaitCause::SequenceExhausted }) => {
                let exhausted = self.last == Some(now) && self.next_seq.is_none_or(|s| s >= per_ms(layout));
                if exhausted && *until_unix_ms == now + 1 {
                    Ok(())
                } else {
                    Err(format!("sequence wait at {now}: {:?}", self.next_seq))
                }
            }
            Err(NotNow::Refuse(refusal)) => {
                let ok = match refusal {
                    Refusal::ClockUnsynchronized { .. } => self.unsynchronized,
                    Refusal::ClockBehind { behind_ms } => {
                        *behind_ms > self.max_wait
                            && (behind_last == Some(*behind_ms) || behind_floor == Some(*behind_ms))
                    }
                    Refusal::OutOfRange(_) => !in_range,
                    Refusal::PastHorizon { horizon_unix_ms } => {
                        *horizon_unix_ms == self.horizon_unix_ms && now >= self.horizon_unix_ms
                    }
                    Refusal::NoLease { layout: name } => lease.is_none() && name == LAYOUTS[layout],
                    Refusal::NotHomeRegion { layout: name, .. } => layout == 0 && !self.home && name == "v1",
                    Refusal::PastFence { machine, expiry_unix_ms, fence_ms } => lease.is_some_and(|l| {
                        l.machine == *machine
                            && l.expiry == *expiry_unix_ms
                            && *fence_ms == self.fence_ms
                            && now >= l.expiry - self.fence_ms
                    }),
                    // This model never retires its region.
                    Refusal::RegionRetired { .. } => false,
                };
                if ok { Ok(()) } else { Err(format!("refusal {refusal:?} at {now} is not justified by {self:?}")) }
            }
        }
    }
}

fn arb_config() -> impl Strategy<Value = (i64, i64)> {
    prop_oneof![Just((500, 5)), (1i64..=1_500, 0i64..=10)]
}

proptest! {
    #![proptest_config(cases(400))]

    /// A single generator, a clock that walks forward and steps back by small and large amounts,
    /// leases that are claimed, renewed, lost and released: every outcome is the one the rules
    /// allow, IDs strictly increase, and nothing is issued behind the clock rules or inside the fence.
    #[test]
    fn generator_follows_the_rules(
        start in arb_start(),
        (fence_ms, max_wait) in arb_config(),
        region in 0u32..=7,
        home in prop::bool::weighted(0.95),
        horizon in prop_oneof![6 => Just(OPEN_HORIZON), 1 => (DEFAULT_V2_FROM - 2_000)..=(DEFAULT_V2_FROM + 2_000)],
        initial in prop::option::weighted(0.8, (0u32..=511, 500i64..=4_000)),
        ops in prop::collection::vec(arb_op(), 1..250),
    ) {
        let config = GeneratorConfig { fence_ms, max_wait_behind_ms: max_wait };
        let schedule = Schedule::default_with_horizon(horizon).unwrap();
        let mut g = Generator::new(config, schedule, region, home).unwrap();
        let mut model = Model {
            fence_ms,
            max_wait,
            region,
            home,
            horizon_unix_ms: horizon as i64 + EPOCH_UNIX_MS,
            unsynchronized: false,
            leases: [None, None],
            last: None,
            next_seq: Some(0),
            last_id: None,
        };
        let mut now = start;
        let mut epoch = 0;
        let mut all_ops = Vec::new();
        if let Some((machine, lease_ms)) = initial {
            all_ops.push(Op::Claim { layout: Model::layout_at(now), machine, lease_ms });
        }
        all_ops.extend(ops);
        for op in all_ops {
            match op {
                Op::Issue { .. } | Op::IssueNear { .. } => {
                    let (target, want) = match op {
                        Op::Issue { dt, want } => (Some(now + dt), want),
                        Op::IssueNear { anchor, offset, want } => {
                            let lease = model.leases[Model::layout_at(now)].as_ref();
                            let base = match anchor {
                                Anchor::Last => model.last,
                                Anchor::Floor => lease.map(|l| l.floor),
                                Anchor::Fence => lease.map(|l| l.expiry - fence_ms),
                                Anchor::Cutover => Some(V2_FROM_UNIX_MS),
                                Anchor::Horizon => Some(model.horizon_unix_ms),
                            };
                            // Only nearby boundaries: a jump of years would leave the clock behind for good.
                            (base.map(|b| b + offset).filter(|t| (t - now).abs() <= 10_000), want)
                        }
                        _ => unreachable!(),
                    };
                    now = target.unwrap_or(now);
                    let outcome = g.issue(now, want);
                    if let Err(problem) = model.check(now, want, &outcome) {
                        return Err(TestCaseError::fail(problem));
                    }
                    prop_assert_eq!(g.last_issued_unix_ms(), model.last);
                }
                Op::Claim { layout, machine, lease_ms } => {
                    epoch += 1;
                    let machine = if layout == 0 { machine } else { machine & 511 };
                    let lease = Lease { layout: LAYOUTS[layout].into(), machine, epoch, expiry_unix_ms: now + lease_ms, floor_unix_ms: now };
                    g.install_lease(lease).unwrap();
                    model.leases[layout] = Some(ModelLease { machine, epoch, floor: now, expiry: now + lease_ms, last_issued: None });
                    // A new lease closes the last millisecond: another machine number in it could
                    // make a smaller ID.
                    model.next_seq = None;
                }
                Op::Extend { layout, by, wrong_epoch } => {
                    let held = model.leases[layout].clone();
                    let (machine, lease_epoch, expiry) = held.as_ref().map_or((0, 0, now), |l| (l.machine, l.epoch, l.expiry));
                    let asked_epoch = if wrong_epoch { lease_epoch + 1 } else { lease_epoch };
                    let extended = g.extend_lease(LAYOUTS[layout], machine, asked_epoch, expiry + by);
                    let expected = held.is_some() && !wrong_epoch && by > 0;
                    prop_assert_eq!(extended, expected);
                    if expected {
                        model.leases[layout].as_mut().unwrap().expiry = expiry + by;
                    }
                }
                Op::Drop { layout } => {
                    let dropped = g.drop_lease(LAYOUTS[layout]);
                    let held = model.leases[layout].take();
                    prop_assert_eq!(dropped.is_some(), held.is_some());
                    if let (Some(view), Some(held)) = (dropped, held) {
                        prop_assert_eq!((view.machine, view.epoch, view.expiry_unix_ms, view.floor_unix_ms), (held.machine, held.epoch, held.expiry, held.floor));
                    }
                }
                Op::Release { layout } => {
                    let release = g.begin_release(LAYOUTS[layout]);
                    let held = model.leases[layout].take();
                    prop_assert_eq!(release.is_some(), held.is_some());
                    if let (Some(release), Some(held)) = (release, held) {
                        prop_assert_eq!(release.machine, held.machine);
                        prop_assert_eq!(release.epoch, held.epoch);
                        prop_assert_eq!(release.expiry_unix_ms, held.last_issued.map_or(held.floor, |t| t + 1));
                        // A successor claiming after this expiry starts above everything issued.
                        prop_assert!(held.last_issued.is_none_or(|t| t < release.expiry_unix_ms));
                    }
                }
                Op::Sync(synchronized) => {
                    g.set_clock_unsynchronized((!synchronized).then(|| "STA_UNSYNC".to_owned()));
                    model.unsynchronized = !synchronized;
                }
            }
            // The generator's view of its leases is the model's.
            for (i, name) in LAYOUTS.iter().enumerate() {
                let view = g.lease(name).map(|v| (v.machine, v.epoch, v.expiry_unix_ms, v.floor_unix_ms));
                let held = model.leases[i].as_ref().map(|l| (l.machine, l.epoch, l.expiry, l.floor));
                prop_assert_eq!(view, held);
            }
        }
    }

    /// `check` predicts `issue` without changing anything.
    #[test]
    fn check_agrees_with_issue(start in arb_start(), dts in prop::collection::vec(arb_dt(), 1..100)) {
        let mut g =
            Generator::new(GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 }, default_schedule(), 1, true).unwrap();
        let layout = LAYOUTS[Model::layout_at(start)];
        g.install_lease(Lease { layout: layout.into(), machine: 9, epoch: 1, expiry_unix_ms: start + 10_000, floor_unix_ms: start }).unwrap();
        let mut now = start;
        for dt in dts {
            now += dt;
            let checked = g.check(now);
            prop_assert_eq!(g.check(now), checked.clone(), "check is pure");
            let issued = g.issue(now, 1);
            prop_assert_eq!(checked, issued.map(|_| ()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// UUIDv7
// ---------------------------------------------------------------------------------------------

/// 48 bits of Unix ms: the range a UUIDv7 timestamp can hold.
const UUID_MS_MAX: i64 = (1 << 48) - 1;

fn arb_uuid_clock() -> impl Strategy<Value = Vec<(i64, u64, u32)>> {
    let step = prop_oneof![
        8 => 0i64..=2,
        2 => -5i64..=-1,
        1 => -100_000i64..=-6,
        1 => 1_000i64..=1_000_000,
    ];
    (0..UUID_MS_MAX - 10_000_000, prop::collection::vec((step, any::<u64>(), any::<u32>()), 1..300)).prop_map(
        |(start, steps)| {
            let mut now = start;
            steps
                .into_iter()
                .map(|(dt, seed, tail)| {
                    now = (now + dt).clamp(-1_000_000, UUID_MS_MAX - 1);
                    (now, seed, tail)
                })
                .collect()
        },
    )
}

fn check_v7_bytes(bytes: &[u8; 16]) -> Result<(), TestCaseError> {
    prop_assert_eq!(bytes[6] >> 4, 7, "version");
    prop_assert_eq!(bytes[8] >> 6, 0b10, "variant");
    let text = uuid::format(bytes);
    prop_assert_eq!(text.len(), 36);
    prop_assert!(text.bytes().all(|c| c == b'-' || c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{}", text);
    prop_assert_eq!(uuid::parse_v7(&text).unwrap(), *bytes);
    prop_assert_eq!(uuid::parse_v7(&text.to_uppercase()).unwrap(), *bytes);
    Ok(())
}

proptest! {
    #![proptest_config(cases(512))]

    /// Strictly increasing for any clock sequence inside the 48-bit range, under the clock rules
    /// of SPEC §3: a reading ahead of the last millisecond used moves to it, one behind by up to
    /// 5 ms waits for the last one, one further behind is refused. Each round-trips through text.
    #[test]
    fn uuid_v7_increasing_and_round_trips(readings in arb_uuid_clock()) {
        let mut state = UuidV7State::default();
        let mut previous: Option<[u8; 16]> = None;
        let mut high = 0;
        for (now, seed, tail) in readings {
            let result = state.next(now, 5, seed, tail);
            if now < high {
                let expected = if high - now <= 5 {
                    NotNow::Wait { until_unix_ms: high, cause: WaitCause::ClockBehind }
                } else {
                    NotNow::Refuse(Refusal::ClockBehind { behind_ms: high - now })
                };
                prop_assert_eq!(result, Err(expected));
                continue;
            }
            let bytes = result.unwrap();
            high = now;
            prop_assert_eq!(uuid::unix_ms(&bytes), high);
            check_v7_bytes(&bytes)?;
            if let Some(previous) = previous {
                prop_assert!(bytes > previous, "{} then {}", uuid::format(&previous), uuid::format(&bytes));
                let text = (uuid::format(&previous), uuid::format(&bytes));
                prop_assert!(text.0 < text.1, "text order follows byte order");
            }
            previous = Some(bytes);
        }
    }

    /// parse(format(x)) == x for any bytes with the version and variant of a v7.
    #[test]
    fn uuid_v7_text_round_trip(mut bytes in any::<[u8; 16]>()) {
        bytes[6] = 0x70 | (bytes[6] & 0x0f);
        bytes[8] = 0x80 | (bytes[8] & 0x3f);
        check_v7_bytes(&bytes)?;
    }

    /// Anything else parses to an error, never a panic.
    #[test]
    fn uuid_parse_never_panics(text in "[-0-9a-fA-Fg-z\u{e9}]{0,40}", bytes in any::<[u8; 16]>()) {
        let _ = uuid::parse_v7(&text);
        let formatted = uuid::format(&bytes);
        let parsed = uuid::parse_v7(&formatted);
        let is_v7 = bytes[6] >> 4 == 7 && bytes[8] >> 6 == 0b10;
        prop_assert_eq!(parsed.is_ok(), is_v7);
        if is_v7 {
            prop_assert_eq!(parsed.unwrap(), bytes);
        }
    }

    /// The `uuid` crate's parser and formatter behave exactly as the hand-written ones they
    /// replaced (kept below as the oracle) on every input: the same bytes, the same error.
    #[test]
    fn uuid_text_matches_the_hand_written_parser(
        text in "[-0-9a-fA-F{}:urnidgz\u{e9} ]{0,46}",
        bytes in any::<[u8; 16]>(),
        at in 0usize..36,
        with in proptest::char::any(),
    ) {
        prop_assert_eq!(uuid::format(&bytes), legacy::format(&bytes));
        let formatted = uuid::format(&bytes);
        let mut mutated: Vec<char> = formatted.chars().collect();
        mutated[at] = with;
        let mutated: String = mutated.into_iter().collect();
        let braced = format!("{{{formatted}}}");
        let urn = format!("urn:uuid:{formatted}");
        let simple = formatted.replace('-', "");
        for input in [&text, &formatted, &formatted.to_uppercase(), &mutated, &braced, &urn, &simple] {
            prop_assert_eq!(uuid::parse_v7(input), legacy::parse_v7(input), "{:?}", input);
        }
    }
}

/// The UUID text code before it went through the `uuid` crate (also the fuzz target's oracle).
#[path = "support/legacy_uuid.rs"]
mod legacy;
