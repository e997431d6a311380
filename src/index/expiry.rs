//! When an entry stops counting (DESIGN.md, "Expiry").
//!
//! Expiry is logical first: an entry whose time plus TTL is at or before the
//! planning time is treated as absent, whether or not it has been dropped
//! from memory yet. Dropping (purging) is then only a matter of space, and
//! when it happens cannot change any decision. Times are the batch records'
//! commit times, so replay decides exactly what the live store decided.

use std::time::Duration;

/// The three TTLs, in milliseconds (`None`: never expires).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Ttls {
    pub seen_ms: Option<u64>,
    pub batch_ms: Option<u64>,
    pub tombstone_ms: Option<u64>,
}

/// A TTL in whole milliseconds, rounded up: an entry may expire after its
/// TTL, never before (a TTL of 0.6 ms rounded down would be none at all).
fn millis(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|d| u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
}

impl Ttls {
    pub(crate) fn new(
        seen: Option<Duration>,
        batch: Option<Duration>,
        tombstone: Option<Duration>,
    ) -> Self {
        Self {
            seen_ms: millis(seen),
            batch_ms: millis(batch),
            tombstone_ms: millis(tombstone),
        }
    }
}

/// Whether something stamped at `at_ms` has expired at `now_ms`.
pub(crate) fn is_expired(at_ms: u64, ttl_ms: Option<u64>, now_ms: u64) -> bool {
    ttl_ms.is_some_and(|ttl| at_ms.saturating_add(ttl) <= now_ms)
}

/// The latest commit time the index can stamp: seen ids and tombstones keep
/// their second in a `u32` (early in the year 2106). A later time would be
/// stamped as this one, and everything stamped would count as expired at
/// once: commits refuse it instead.
pub(crate) const COMMIT_MS_MAX: u64 = u32::MAX as u64 * 1000;

/// A time in whole seconds, rounded up so that an entry never expires early.
pub(crate) fn to_secs_ceil(ms: u64) -> u32 {
    u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX)
}

/// Milliseconds of a time stored in seconds.
pub(crate) fn secs_to_ms(secs: u32) -> u64 {
    u64::from(secs) * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_at_or_after_the_ttl_never_before() {
        assert!(!is_expired(1_500, Some(1_000), 2_499));
        assert!(is_expired(1_500, Some(1_000), 2_500));
        assert!(!is_expired(0, None, u64::MAX));
        // Rounding a stamp to seconds only ever delays expiry.
        let stamp = secs_to_ms(to_secs_ceil(1_500));
        assert!(stamp >= 1_500 && !is_expired(stamp, Some(1_000), 2_500));
    }

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        let ms = |d: Duration| Ttls::new(Some(d), None, None).seen_ms;
        assert_eq!(ms(Duration::from_micros(600)), Some(1));
        assert_eq!(ms(Duration::from_micros(1_500)), Some(2));
        assert_eq!(ms(Duration::from_millis(7)), Some(7));
        assert_eq!(ms(Duration::ZERO), Some(0));
        assert_eq!(ms(Duration::MAX), Some(u64::MAX));
        // An id stamped at 1,000 ms with a 0.6 ms TTL counts in its own ms.
        assert!(!is_expired(1_000, ms(Duration::from_micros(600)), 1_000));
    }

    #[test]
    fn a_ttl_too_long_to_add_to_a_stamp_never_ends_before_it() {
        // `Duration::MAX` is a way to say "never": its end lies past every
        // time a commit can have, not wrapped round to before the stamp.
        let ttl_ms = Ttls::new(Some(Duration::MAX), None, None).seen_ms;
        assert!(!is_expired(1_500, ttl_ms, COMMIT_MS_MAX));
        assert!(!is_expired(
            COMMIT_MS_MAX,
            Some(u64::MAX - 1),
            COMMIT_MS_MAX
        ));
    }
}
