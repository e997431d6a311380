//! Model test with time: random histories of batches, millisecond clock
//! advances, compactions and reopens, with short TTLs that a reopen may
//! lengthen, shorten or turn off, and in some cases a tombstone TTL.
//! Expiry may change how a late redelivery is counted, never the state it
//! leads to beyond what the expired entry allowed, and no `Add` ever applies
//! twice (SPEC section 3, "Expiry never re-applies").
//!
//! The reference decides each delivery from the test's own clock: it
//! records when each event id, batch id, tombstone and delta was committed
//! and the TTLs of every open since, and asks whether the entry is surely
//! alive, surely expired, or either (DESIGN.md, "Expiry": seen ids and
//! tombstones are stamped in whole seconds rounded up, batch ids and add
//! windows in milliseconds). Only where the times leave a decision open
//! does it allow both outcomes; it then keeps every state the store may be
//! in (a "world" each) and drops those the store's report, rows and
//! quarantine rule out. The store's answer never widens what is expected.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, BatchReport, Clock, Durability, ManualClock, Options, Store};
use proptest::prelude::*;

const TTL_SECS: u64 = 10;
const KEYS: u64 = 4;
const EVENTS: u64 = 24;

#[derive(Debug, Clone)]
enum Step {
    /// Deliveries of event numbers (repeats are redeliveries), and at most one delta event.
    Apply {
        events: Vec<u64>,
        delta: Option<u64>,
    },
    /// The same batch id as an earlier step, with the same content.
    Replay {
        step: usize,
    },
    /// Milliseconds, so that commit times fall anywhere within a second.
    Advance {
        ms: u64,
    },
    Compact,
    /// Reopens with this seen and batch TTL, in seconds (`None`: never);
    /// the tombstone TTL stays the case's.
    Reopen {
        ttl_secs: Option<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (prop::collection::vec(0..EVENTS, 0..6), prop::option::of(0..EVENTS))
            .prop_map(|(events, delta)| Step::Apply { events, delta }),
        1 => (0usize..40).prop_map(|step| Step::Replay { step }),
        3 => (1..2 * TTL_SECS * 1000).prop_map(|ms| Step::Advance { ms }),
        1 => Just(Step::Compact),
        1 => prop::option::weighted(0.8, prop::sample::select(vec![TTL_SECS / 2, TTL_SECS, 10 * TTL_SECS]))
            .prop_map(|ttl_secs| Step::Reopen { ttl_secs }),
    ]
}

/// The key event `n` changes.
fn key_of(n: u64) -> u64 {
    n % KEYS
}

/// Event `n` is a delete for every fifth `n`, else a put.
fn is_delete(n: u64) -> bool {
    n % 5 == 4
}

/// The value event `n` puts: shared by events `n` and `n + 4` within a run
/// of eight, so that some newer puts on a key are `unchanged`.
fn value_of(n: u64) -> u64 {
    n / 8
}

/// Event `n`: a put (or delete) of key `n % KEYS` at seq `n`.
fn event(batch: Batch, n: u64) -> Batch {
    let key = format!("k{}", key_of(n));
    if is_delete(n) {
        batch.delete(format!("e{n}"), key, n)
    } else {
        batch.put(format!("e{n}"), key, n, format!("v{}", value_of(n)))
    }
}

/// Delta event `n`: adds `n + 1` to the counter, at seq `n`.
fn delta_event(batch: Batch, n: u64) -> Batch {
    batch.add(format!("a{n}"), "counter", n, (n + 1) as i64)
}

fn batch_id(id: usize) -> String {
    format!("B{id}")
}

fn build(id: usize, events: &[u64], delta: Option<u64>) -> Batch {
    let mut batch = Batch::new(batch_id(id));
    for &n in events {
        batch = event(batch, n);
    }
    if let Some(n) = delta {
        batch = delta_event(batch, n);
    }
    batch
}

/// A commit time on the test's clock, and the open it happened in (which
/// says which TTLs have been in force since).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ms: u64,
    open: usize,
}

/// One open's TTLs in milliseconds (`None`: never). The batch TTL is the
/// seen TTL throughout.
#[derive(Debug, Clone, Copy)]
struct Ttls {
    seen_ms: Option<u64>,
    tombstone_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    Alive,
    Expired,
    /// Expired under a shorter TTL of an earlier open, but not under the
    /// current one: it counts again unless a merge or compaction dropped it
    /// meanwhile, which the test does not know.
    Either,
}

/// The TTLs of every open so far, and when each earlier open was closed.
struct History {
    opens: Vec<Ttls>,
    closed_ms: Vec<u64>,
}

/// A time rounded up to whole seconds, as seen ids and tombstones are
/// stamped: they may outlive their TTL by up to a second, never fall short.
fn secs_ceil_ms(ms: u64) -> u64 {
    ms.div_ceil(1000) * 1000
}

impl History {
    fn now(&self, clock: &ManualClock) -> Stamp {
        Stamp {
            ms: clock.now_ms(),
            open: self.opens.len() - 1,
        }
    }

    fn reopen(&mut self, ttls: Ttls, clock: &ManualClock) {
        self.closed_ms.push(clock.now_ms());
        self.opens.push(ttls);
    }

    /// An entry stamped at `at_ms` during open `since` is surely expired if
    /// the current TTL says so (expiry is logical). It is surely alive if it
    /// is not, and no earlier open since then could have dropped it: an open
    /// drops only what had expired under its own TTL by the time it closed.
    fn liveness(
        &self,
        at_ms: u64,
        since: usize,
        ttl: fn(&Ttls) -> Option<u64>,
        now: Stamp,
    ) -> Liveness {
        let expired_by = |t: &Ttls, ms: u64| ttl(t).is_some_and(|d| at_ms + d <= ms);
        if expired_by(&self.opens[now.open], now.ms) {
            Liveness::Expired
        } else if (since..now.open).any(|k| expired_by(&self.opens[k], self.closed_ms[k])) {
            Liveness::Either
        } else {
            Liveness::Alive
        }
    }

    fn seen_id(&self, at: Stamp, now: Stamp) -> Liveness {
        self.liveness(secs_ceil_ms(at.ms), at.open, |t| t.seen_ms, now)
    }

    fn tombstone(&self, at: Stamp, now: Stamp) -> Liveness {
        self.liveness(secs_ceil_ms(at.ms), at.open, |t| t.tombstone_ms, now)
    }

    fn batch_id(&self, at: Stamp, now: Stamp) -> Liveness {
        self.liveness(at.ms, at.open, |t| t.seen_ms, now)
    }

    /// Add windows start at an `Add`'s commit time in milliseconds and
    /// expire with the seen TTL.
    fn add_window(&self, start: Stamp, now: Stamp) -> Liveness {
        self.liveness(start.ms, start.open, |t| t.seen_ms, now)
    }
}

/// A key's entry: its newest version, a live row or a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    Live { seq: u64, value: u64 },
    Tombstone { seq: u64, at: Stamp },
}

/// How one delivery is counted, in `BatchReport::counts` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Inserted = 0,
    Updated,
    Unchanged,
    Stale,
    Duplicate,
    Deleted,
    Added,
    Rejected,
}

/// One state the store may be in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct World {
    keys: BTreeMap<u64, Version>,
    /// When each put/delete event id was last recorded as seen.
    seen: BTreeMap<u64, Stamp>,
    /// Applied deltas and when: a delta's id is recorded only when it applies.
    added: BTreeMap<u64, Stamp>,
    /// Every `too_late` delta: batch id, index in its batch, event id.
    too_late: Vec<(String, u64, String)>,
}

/// A world part way through planning a batch: its counts so far and the
/// ids counted earlier in the batch (their redeliveries are duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Planning {
    world: World,
    counts: [u64; 8],
    in_batch: BTreeSet<String>,
}

impl World {
    /// The ways a new-looking put or delete of event `n` may go at `now`,
    /// by the key's version: a live tombstone holds older puts back just
    /// like a live row; an expired one leaves the key absent.
    fn key_outcomes(&self, n: u64, now: Stamp, history: &History) -> Vec<(Count, Option<Version>)> {
        let fresh = || {
            if is_delete(n) {
                (Count::Deleted, Some(Version::Tombstone { seq: n, at: now }))
            } else {
                let value = value_of(n);
                (Count::Inserted, Some(Version::Live { seq: n, value }))
            }
        };
        let newer = |seq: u64, live_value: Option<u64>| {
            if n <= seq {
                (Count::Stale, None)
            } else if is_delete(n) {
                (Count::Deleted, Some(Version::Tombstone { seq: n, at: now }))
            } else {
                let value = value_of(n);
                let count = match live_value {
                    Some(v) if v == value => Count::Unchanged,
                    Some(_) => Count::Updated,
                    None => Count::Inserted,
                };
                (count, Some(Version::Live { seq: n, value }))
            }
        };
        match self.keys.get(&key_of(n)) {
            None => vec![fresh()],
            Some(&Version::Live { seq, value }) => vec![newer(seq, Some(value))],
            Some(&Version::Tombstone { seq, at }) => match history.tombstone(at, now) {
                Liveness::Alive => vec![newer(seq, None)],
                Liveness::Expired => vec![fresh()],
                Liveness::Either => vec![newer(seq, None), fresh()],
            },
        }
    }

    /// The ways a fresh delta `n` (never applied) may go: it must apply
    /// while no add window can have expired, or if its seq is above every
    /// applied delta's (the floor never exceeds those); otherwise the floor
    /// may refuse it.
    fn fresh_delta_may_be_too_late(&self, n: u64, now: Stamp, history: &History) -> bool {
        let Some(max_seq) = self.added.keys().next_back() else {
            return false;
        };
        let first = self
            .added
            .values()
            .min_by_key(|s| s.ms)
            .expect("an applied delta");
        n <= *max_seq && history.add_window(*first, now) != Liveness::Alive
    }

    fn rows(&self) -> Vec<(String, u64, String)> {
        let mut rows: Vec<_> = self
            .keys
            .iter()
            .filter_map(|(k, v)| match v {
                Version::Live { seq, value } => Some((format!("k{k}"), *seq, format!("v{value}"))),
                Version::Tombstone { .. } => None,
            })
            .collect();
        if let Some(&seq) = self.added.keys().next_back() {
            let sum: u64 = self.added.keys().map(|n| n + 1).sum();
            rows.insert(0, ("counter".to_owned(), seq, sum.to_string()));
        }
        rows
    }
}

impl Planning {
    /// Every way the put or delete of event `n` may be counted.
    fn event(&self, n: u64, now: Stamp, history: &History) -> Vec<Planning> {
        let id = format!("e{n}");
        // An id never recorded is as good as expired.
        let seen = if self.in_batch.contains(&id) {
            Liveness::Alive
        } else {
            match self.world.seen.get(&n) {
                Some(&at) => history.seen_id(at, now),
                None => Liveness::Expired,
            }
        };
        let mut next = Vec::new();
        if seen != Liveness::Expired {
            next.push(self.counted(Count::Duplicate, |_| {}));
        }
        if seen != Liveness::Alive {
            for (count, version) in self.world.key_outcomes(n, now, history) {
                next.push(self.counted(count, |w| {
                    w.seen.insert(n, now);
                    if let Some(v) = version {
                        w.keys.insert(key_of(n), v);
                    }
                }));
            }
        }
        // Whichever way it went, the id is seen for the rest of the batch.
        for p in &mut next {
            p.in_batch.insert(id.clone());
        }
        next
    }

    /// Every way delta `n`, at `index` in batch `batch`, may be counted.
    fn delta(
        &self,
        n: u64,
        batch: &str,
        index: u64,
        now: Stamp,
        history: &History,
    ) -> Vec<Planning> {
        let added = |p: &Planning| {
            p.counted(Count::Added, |w| {
                w.added.insert(n, now);
            })
        };
        let too_late = |p: &Planning| {
            p.counted(Count::Rejected, |w| {
                w.too_late.push((batch.to_owned(), index, format!("a{n}")))
            })
        };
        match self.world.added.get(&n) {
            // Applied before: a duplicate while its id is seen, and once it
            // may not be, never applied again.
            Some(&at) => match history.seen_id(at, now) {
                Liveness::Alive => vec![self.counted(Count::Duplicate, |_| {})],
                Liveness::Expired => vec![too_late(self)],
                Liveness::Either => vec![self.counted(Count::Duplicate, |_| {}), too_late(self)],
            },
            None if self.world.fresh_delta_may_be_too_late(n, now, history) => {
                vec![added(self), too_late(self)]
            }
            None => vec![added(self)],
        }
    }

    fn counted(&self, count: Count, change: impl FnOnce(&mut World)) -> Planning {
        let mut p = self.clone();
        p.counts[count as usize] += 1;
        change(&mut p.world);
        p
    }
}

/// Every (world, counts) a batch planned afresh at `now` may lead to.
fn plan(
    worlds: &[World],
    id: usize,
    events: &[u64],
    delta: Option<u64>,
    now: Stamp,
    history: &History,
) -> Vec<Planning> {
    let mut frontier: Vec<Planning> = worlds
        .iter()
        .map(|w| Planning {
            world: w.clone(),
            counts: [0; 8],
            in_batch: BTreeSet::new(),
        })
        .collect();
    for &n in events {
        frontier = distinct(frontier.iter().flat_map(|p| p.event(n, now, history)));
    }
    if let Some(n) = delta {
        let index = events.len() as u64;
        frontier = distinct(
            frontier
                .iter()
                .flat_map(|p| p.delta(n, &batch_id(id), index, now, history)),
        );
    }
    frontier
}

/// The items without repeats, in first-seen order.
fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn rows(store: &Store) -> Vec<(String, u64, String)> {
    store
        .scan_prefix(b"")
        .map(|r| {
            let (k, rec) = r.expect("row");
            (
                String::from_utf8(k.to_vec()).unwrap(),
                rec.seq,
                String::from_utf8(rec.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

/// The quarantine as the reference records it; every reason must be `too_late`.
fn too_late(store: &Store) -> Result<Vec<(String, u64, String)>, TestCaseError> {
    let mut entries = Vec::new();
    for q in store.quarantine() {
        prop_assert_eq!(&q.reason, "too_late", "{:?}", q);
        entries.push((
            String::from_utf8(q.batch_id.to_vec()).unwrap(),
            q.index,
            String::from_utf8(q.event_id.to_vec()).unwrap(),
        ));
    }
    Ok(entries)
}

/// The reference: the times and TTLs it has recorded, and every state the
/// store may be in.
struct Reference {
    history: History,
    worlds: Vec<World>,
    /// Each batch id's latest commit and the report it committed with.
    committed: BTreeMap<usize, (Stamp, BatchReport)>,
}

impl Reference {
    /// Whether batch `id` may be replayed at `now`, and whether it may be
    /// planned afresh: a batch id that never committed is never replayed,
    /// one surely within its TTL always is.
    fn may_replay_or_plan(&self, id: usize, now: Stamp) -> (bool, bool) {
        match self.committed.get(&id) {
            None => (false, true),
            Some(&(at, _)) => match self.history.batch_id(at, now) {
                Liveness::Alive => (true, false),
                Liveness::Expired => (false, true),
                Liveness::Either => (true, true),
            },
        }
    }

    /// Applies batch `id` to the store at `now` and checks its report, rows
    /// and quarantine against what the reference allows; keeps the states
    /// they leave possible.
    fn apply(
        &mut self,
        store: &Store,
        now: Stamp,
        id: usize,
        events: &[u64],
        delta: Option<u64>,
    ) -> Result<(), TestCaseError> {
        let (may_replay, may_plan) = self.may_replay_or_plan(id, now);
        let report = store.apply_batch(&build(id, events, delta)).unwrap();
        prop_assert_eq!(
            report.deliveries(),
            (events.len() + usize::from(delta.is_some())) as u64
        );
        let rows = rows(store);
        let quarantine = too_late(store)?;
        if report.replayed {
            prop_assert!(may_replay, "batch B{} replayed: {:?}", id, report);
            let first = self.committed[&id].1;
            let expected = BatchReport {
                replayed: true,
                ..first
            };
            prop_assert_eq!(report, expected, "replay of batch B{}", id);
            self.worlds
                .retain(|w| w.rows() == rows && w.too_late == quarantine);
        } else {
            prop_assert!(may_plan, "batch B{} not replayed: {:?}", id, report);
            let planned = plan(&self.worlds, id, events, delta, now, &self.history);
            let allowed = distinct(planned.iter().map(|p| p.counts));
            prop_assert!(
                allowed.contains(&report.counts()),
                "batch B{} counted {:?}; allowed counts {:?}",
                id,
                report.counts(),
                allowed
            );
            self.worlds = distinct(
                planned
                    .into_iter()
                    .filter(|p| {
                        p.counts == report.counts()
                            && p.world.rows() == rows
                            && p.world.too_late == quarantine
                    })
                    .map(|p| p.world),
            );
            self.committed.insert(id, (now, report));
        }
        prop_assert!(
            !self.worlds.is_empty(),
            "after batch B{}: rows {:?} and quarantine {:?} match no state the reference allows",
            id,
            rows,
            quarantine
        );
        Ok(())
    }
}

fn run(
    durability: Durability,
    tombstone_secs: Option<u64>,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let ttls = |ttl_secs: Option<u64>| Ttls {
        seen_ms: ttl_secs.map(|s| s * 1000),
        tombstone_ms: tombstone_secs.map(|s| s * 1000),
    };
    let options = |ttl_secs: Option<u64>| {
        let ttl = ttl_secs.map(Duration::from_secs);
        Options::default()
            .durability(durability)
            .clock(Arc::new(clock.clone()))
            .seen_ttl(ttl)
            .batch_ttl(ttl)
            .tombstone_ttl(tombstone_secs.map(Duration::from_secs))
            .segment_bytes_max(2048)
    };
    let mut store = Some(Store::open(dir.path(), options(Some(TTL_SECS))).unwrap());
    let mut reference = Reference {
        history: History {
            opens: vec![ttls(Some(TTL_SECS))],
            closed_ms: Vec::new(),
        },
        worlds: vec![World::default()],
        committed: BTreeMap::new(),
    };
    let mut applied: Vec<(Vec<u64>, Option<u64>)> = Vec::new();

    for (i, step) in steps.into_iter().enumerate() {
        let s = store.as_ref().expect("open");
        let (id, events, delta) = match step {
            Step::Apply { events, delta } => {
                applied.push((events.clone(), delta));
                (applied.len() - 1, events, delta)
            }
            Step::Replay { step } if !applied.is_empty() => {
                let id = step % applied.len();
                let (events, delta) = applied[id].clone();
                (id, events, delta)
            }
            Step::Replay { .. } => continue,
            Step::Advance { ms } => {
                clock.advance(Duration::from_millis(ms));
                continue;
            }
            Step::Compact => {
                let before = s.digest().unwrap();
                s.compact().unwrap();
                prop_assert_eq!(
                    s.digest().unwrap(),
                    before,
                    "compaction changed the state at step {}",
                    i
                );
                continue;
            }
            Step::Reopen { ttl_secs } => {
                let before = s.digest().unwrap();
                store.take().unwrap().close().unwrap();
                let reopened = Store::open(dir.path(), options(ttl_secs)).unwrap();
                prop_assert_eq!(
                    reopened.digest().unwrap(),
                    before,
                    "reopen changed the state at step {}",
                    i
                );
                reference.history.reopen(ttls(ttl_secs), &clock);
                store = Some(reopened);
                continue;
            }
        };
        let now = reference.history.now(&clock);
        reference
            .apply(s, now, id, &events, delta)
            .map_err(|e| match e {
                TestCaseError::Fail(why) => {
                    TestCaseError::fail(format!("step {i}: {}", why.message()))
                }
                reject => reject,
            })?;
    }
    Ok(())
}

/// Two histories the property once failed on, written out because the
/// seeds saved for them no longer generate them from these steps: a delta
/// redelivered exactly at its TTL, and one redelivered after a compaction
/// dropped its id and a reopen turned the TTL off. Neither may apply again.
#[test]
fn a_delta_redelivered_at_its_ttl_or_after_its_id_was_dropped_is_not_applied_again() {
    let delta = |n| Step::Apply {
        events: vec![],
        delta: Some(n),
    };
    let advance = |secs: u64| Step::Advance { ms: secs * 1000 };
    run(
        Durability::Buffered,
        None,
        vec![delta(17), advance(7), advance(3), delta(17)],
    )
    .unwrap();
    run(
        Durability::Buffered,
        None,
        vec![
            delta(14),
            advance(10),
            Step::Apply {
                events: vec![],
                delta: None,
            },
            Step::Compact,
            Step::Reopen { ttl_secs: None },
            delta(14),
        ],
    )
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Under `Sync` as under `Buffered`: a batch then waits in the
    /// pending overlay, planned against expiry as of its own commit time.
    #[test]
    fn expiry_changes_counts_never_state_and_deltas_apply_at_most_once(
        is_sync in any::<bool>(),
        tombstone_secs in prop::option::weighted(0.5, prop::sample::select(vec![TTL_SECS / 2, TTL_SECS])),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let durability = if is_sync { Durability::Sync } else { Durability::Buffered };
        run(durability, tombstone_secs, steps)?;
    }
}
