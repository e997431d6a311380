//! Per-counter-key marks that keep `Add` exactly-once after seen ids expire
//! (DESIGN.md, "Expiry").
//!
//! Once an `Add`'s event id may have expired, a redelivery of it can no longer
//! be told from a new event by its id. Each counter key therefore keeps a
//! *floor*: a seq at or above every `Add` on the key whose id may have
//! expired. A new-looking `Add` with seq at or below the floor is refused as
//! `too_late`, never applied.
//!
//! The floor is kept conservatively with one open window per key: the window
//! starts at the time of the oldest `Add` in it and holds the largest seq
//! since. Once the window's oldest `Add` may have expired, the whole window
//! counts toward the floor, and the next `Add` opens a new window.

use std::collections::HashMap;

use super::expiry::is_expired;

/// One counter key's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AddMark {
    /// Largest seq of the `Add`s folded out of earlier windows, if any.
    pub floor: Option<u64>,
    /// Commit time of the oldest `Add` in the open window.
    pub window_start_ms: u64,
    /// Largest seq of the `Add`s in the open window.
    pub window_seq: u64,
}

impl AddMark {
    /// The seq at or below which a new-looking `Add` is refused at `now_ms`.
    fn floor_at(&self, ttl_ms: Option<u64>, now_ms: u64) -> Option<u64> {
        if is_expired(self.window_start_ms, ttl_ms, now_ms) {
            Some(
                self.floor
                    .map_or(self.window_seq, |f| f.max(self.window_seq)),
            )
        } else {
            self.floor
        }
    }
}

impl AddMark {
    /// The mark as a state file taken at `now_ms` records it: a window
    /// whose start has expired is folded into the floor. Its ids may be
    /// missing from that state (a merge or a compaction drops expired ids),
    /// and an open under a longer `seen_ttl`, or none, would count the
    /// window as open again, with nothing left to tell its redeliveries
    /// from new deltas. Under the TTL it was settled by, the mark decides
    /// exactly as before: that window already counted toward the floor.
    pub(crate) fn settled(self, ttl_ms: Option<u64>, now_ms: u64) -> Self {
        Self {
            floor: self.floor_at(ttl_ms, now_ms),
            ..self
        }
    }
}

/// Marks of every key that has ever received an `Add`.
#[derive(Debug, Default)]
pub(crate) struct AddMarks {
    ttl_ms: Option<u64>,
    marks: HashMap<Box<[u8]>, AddMark>,
}

impl AddMarks {
    /// Empty marks for seen ids that expire after `ttl_ms`.
    pub(crate) fn new(ttl_ms: Option<u64>) -> Self {
        Self {
            ttl_ms,
            marks: HashMap::new(),
        }
    }

    /// The seq at or below which an `Add` on `key` is `too_late` at `now_ms`
    /// (`None`: any seq may be new).
    pub(crate) fn floor(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        self.marks.get(key)?.floor_at(self.ttl_ms, now_ms)
    }

    /// Records `Add`s on `key` up to `seq`, committed at `now_ms`.
    pub(crate) fn record(&mut self, key: &[u8], seq: u64, now_ms: u64) {
        let ttl_ms = self.ttl_ms;
        match self.marks.get_mut(key) {
            Some(mark) if is_expired(mark.window_start_ms, ttl_ms, now_ms) => {
                mark.floor = mark.floor_at(ttl_ms, now_ms);
                mark.window_start_ms = now_ms;
                mark.window_seq = seq;
            }
            Some(mark) => mark.window_seq = mark.window_seq.max(seq),
            None => {
                let mark = AddMark {
                    floor: None,
                    window_start_ms: now_ms,
                    window_seq: seq,
                };
                self.marks.insert(key.into(), mark);
            }
        }
    }

    /// Whether `key` has a mark.
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.marks.contains_key(key)
    }

    /// Gives `key` the mark it has in `from`, unless it has one here: marks
    /// that shadow `from`'s then carry on from its history.
    pub(crate) fn inherit(&mut self, key: &[u8], from: &AddMarks) {
        if !self.contains(key)
            && let Some(&mark) = from.marks.get(key)
        {
            self.restore(key, mark);
        }
    }

    /// Sets a key's mark as a snapshot recorded it.
    pub(crate) fn restore(&mut self, key: &[u8], mark: AddMark) {
        self.marks.insert(key.into(), mark);
    }

    /// Every mark settled at `now_ms` (`AddMark::settled`), as a state file
    /// records them.
    pub(crate) fn settled_at(&self, now_ms: u64) -> impl Iterator<Item = (&[u8], AddMark)> {
        self.marks
            .iter()
            .map(move |(k, m)| (&k[..], m.settled(self.ttl_ms, now_ms)))
    }

    pub(crate) fn len(&self) -> u64 {
        self.marks.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_covers_every_add_whose_id_may_have_expired() {
        let mut marks = AddMarks::new(Some(1_000));
        marks.record(b"k", 10, 0);
        marks.record(b"k", 20, 500);
        // Nothing may have expired yet: a late seq-5 add is still provably new
        // only if its id is unseen, and the floor does not refuse it.
        assert_eq!(marks.floor(b"k", 999), None);
        // At 1000 the add at 0 (seq 10) may have expired: the window counts.
        assert_eq!(marks.floor(b"k", 1_000), Some(20));
        marks.record(b"k", 30, 1_200);
        assert_eq!(marks.floor(b"k", 1_200), Some(20));
        assert_eq!(marks.floor(b"k", 2_200), Some(30));
        assert_eq!(marks.floor(b"other", 5_000), None);
    }

    #[test]
    fn a_settled_mark_decides_as_before_and_keeps_its_floor_under_a_longer_ttl() {
        let mut marks = AddMarks::new(Some(1_000));
        marks.record(b"k", 10, 0);
        marks.record(b"k", 20, 500);
        let settled = |now_ms| marks.settled_at(now_ms).next().expect("one mark").1;
        // Before the window's start expires there is nothing to settle.
        assert_eq!(settled(999), marks.marks[&b"k"[..]]);
        let mark = settled(1_200);
        assert_eq!(mark.floor, Some(20));
        let mut reloaded = AddMarks::new(Some(1_000));
        reloaded.restore(b"k", mark);
        for now_ms in [1_200, 1_499, 5_000] {
            assert_eq!(reloaded.floor(b"k", now_ms), marks.floor(b"k", now_ms));
        }
        reloaded.record(b"k", 30, 1_300);
        marks.record(b"k", 30, 1_300);
        assert_eq!(reloaded.marks[&b"k"[..]], marks.marks[&b"k"[..]]);
        // Under a longer TTL, or none, the window whose ids a state taken at
        // 1,200 may have left out still counts.
        for ttl_ms in [Some(10_000), None] {
            let mut longer = AddMarks::new(ttl_ms);
            longer.restore(b"k", mark);
            assert_eq!(longer.floor(b"k", 1_300), Some(20), "{ttl_ms:?}");
        }
    }

    #[test]
    fn a_window_holds_its_largest_seq_whatever_order_its_adds_come_in() {
        let mut marks = AddMarks::new(Some(1_000));
        marks.record(b"k", 20, 0);
        marks.record(b"k", 10, 500);
        assert_eq!(marks.floor(b"k", 1_000), Some(20));
    }

    #[test]
    fn without_a_ttl_nothing_is_too_late() {
        let mut marks = AddMarks::new(None);
        marks.record(b"k", 10, 0);
        assert_eq!(marks.floor(b"k", u64::MAX), None);
    }
}
