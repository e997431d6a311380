//! Hashers for the in-memory maps on the hot path.
//!
//! std's default SipHash is built to resist collision attacks on arbitrary
//! keys, and costs accordingly. Maps keyed by event-id hashes need no
//! hashing at all; maps keyed by caller bytes use xxh3 with a fixed seed.
//! These maps live for one batch, so keys crafted to collide can slow down
//! only the batch that carries them. The seen index's recent ids live
//! longer (until a merge takes them): their maps mix the ids under a seed
//! of their own (`SeededIdMap`).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::num::NonZeroU64;
use std::sync::OnceLock;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// For keys that are already uniform hashes (xxh3-128 of an event id).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Folds the bytes of a hash (`[u64; 2]` arrives here) 8 at a time.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word.iter_mut().zip(chunk).for_each(|(w, b)| *w = *b);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    /// A slice's length prefix carries nothing for fixed-size hashes.
    fn write_usize(&mut self, _: usize) {}

    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }

    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v >> 64) as u64 ^ v as u64;
    }
}

/// For keys that are caller bytes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct BytesHasher(u64);

impl Hasher for BytesHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxh3_64_with_seed(bytes, self.0);
    }

    fn write_usize(&mut self, n: usize) {
        // The length prefix of a slice: fold it into the seed.
        self.0 = self.0.rotate_left(17) ^ n as u64;
    }
}

/// A map keyed by event-id hashes.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A map keyed by event-id hashes that outlives a batch. Senders choose
/// event ids, and xxh3 is not built to keep them from finding ids whose
/// hashes share the bits a table probes by (a few thousand tries an id
/// for the bits of one shard's table): `IdHasher`'s fold of such ids put
/// them all on one probe sequence, each insert and lookup walking the
/// others until a merge. Here the fold is mixed under seeds drawn at
/// random for each map, so that only ids whose whole 64-bit folds agree
/// share their probes.
pub(crate) type SeededIdMap<K, V> = HashMap<K, V, SeededIds>;

/// Builds `SeededIdHasher`s under the map's seeds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeededIds {
    seeds: [u64; 2],
}

impl Default for SeededIds {
    fn default() -> Self {
        let random = RandomState::new();
        Self {
            // The multiplier odd, so that the product loses no bit of the fold.
            seeds: [random.hash_one(0u64), random.hash_one(1u64) | 1],
        }
    }
}

impl BuildHasher for SeededIds {
    type Hasher = SeededIdHasher;

    fn build_hasher(&self) -> SeededIdHasher {
        SeededIdHasher {
            fold: IdHasher::default(),
            seeds: self.seeds,
        }
    }
}

/// `IdHasher`'s fold, then a folded multiply under the map's seeds: the
/// 128-bit product's halves xored, so that every bit of the result
/// depends on every bit of the fold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeededIdHasher {
    fold: IdHasher,
    seeds: [u64; 2],
}

impl Hasher for SeededIdHasher {
    fn finish(&self) -> u64 {
        let [add, multiply] = self.seeds;
        let product = u128::from(self.fold.finish() ^ add) * u128::from(multiply);
        (product >> 64) as u64 ^ product as u64
    }

    fn write(&mut self, bytes: &[u8]) {
        self.fold.write(bytes);
    }

    fn write_usize(&mut self, n: usize) {
        self.fold.write_usize(n);
    }

    fn write_u64(&mut self, v: u64) {
        self.fold.write_u64(v);
    }

    fn write_u128(&mut self, v: u128) {
        self.fold.write_u128(v);
    }
}

/// A map keyed by caller bytes.
pub(crate) type BytesMap<K, V> = HashMap<K, V, BuildHasherDefault<BytesHasher>>;

/// A keyed hash of a value's bytes, which tells a `Put` of the stored
/// bytes (`unchanged`) from one of other bytes without reading the stored
/// value (DESIGN.md, "Deciding an unchanged put").
///
/// A CRC will not do: it is linear, so any value's CRC can be matched by
/// choosing four of its bytes, and neither will any unkeyed hash, whose
/// collisions a sender could search for offline. std's `RandomState` is a
/// keyed hash built to resist exactly that (SipHash-1-3 today), under a
/// key drawn at random once per process: fingerprints mean nothing to
/// another process, so they are never written to disk. Zero is left out
/// so that a record of the key index can say "not known" with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint(NonZeroU64);

/// Values longer than this are not fingerprinted: hashing each as it is
/// written would cost more than reading back the few that a `Put` of the
/// same length and CRC ever meets (200 ns at 1 KiB against a `pread` of
/// 1.2-1.5 µs, but 13 µs at 64 KiB), under the index's write lock.
pub(crate) const FINGERPRINT_BYTES_MAX: usize = 1024;

impl Fingerprint {
    pub(crate) fn of(value: &[u8]) -> Self {
        static KEY: OnceLock<RandomState> = OnceLock::new();
        let hash = KEY.get_or_init(RandomState::new).hash_one(value);
        Self(NonZeroU64::new(hash).unwrap_or(NonZeroU64::MIN))
    }

    /// The fingerprint as a record of the key index holds it (never 0).
    pub(crate) fn get(self) -> u64 {
        self.0.get()
    }

    /// A fingerprint a record holds; `None` for 0, "not known".
    pub(crate) fn from_stored(stored: u64) -> Option<Self> {
        NonZeroU64::new(stored).map(Self)
    }
}

/// Asks the CPU to fetch the cache line holding `at`, so that a read a
/// little later finds it in cache: index lookups are cache misses, and a
/// batch knows its lookups in advance.
#[inline]
pub(crate) fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let at: *const T = at;
        #[expect(unsafe_code, reason = "a prefetch is a hint: it reads nothing")]
        // SAFETY: `at` comes from a reference; a prefetch never faults and
        // changes no memory.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn id_hashes_pass_through_without_rehashing() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let id = [0x0123_4567_89ab_cdef_u64, 0xfedc_ba98_7654_3210];
        assert_eq!(build.hash_one(id), id[0].rotate_left(29) ^ id[1]);
        assert_eq!(build.hash_one(5u128 << 64 | 3), 5 ^ 3);
    }

    #[test]
    fn fingerprints_tell_values_apart_and_round_trip_through_a_record() {
        let a = Fingerprint::of(b"the value");
        assert_eq!(a, Fingerprint::of(b"the value"));
        assert_ne!(a, Fingerprint::of(b"the valuf"));
        assert_ne!(Fingerprint::of(b""), Fingerprint::of(b"\0"));
        assert_eq!(Fingerprint::from_stored(a.get()), Some(a));
        assert_eq!(Fingerprint::from_stored(0), None);
    }

    /// Ids whose unkeyed folds share their low 32 bits (what a sender can
    /// search for) share a table's probe sequence under `IdHasher`, and
    /// spread under a seeded map's hasher.
    #[test]
    fn ids_crafted_to_share_a_fold_s_low_bits_spread_under_a_seeded_map() {
        let ids: Vec<[u64; 2]> = (0..1_000u64)
            .map(|i| {
                let high = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                // rotl(high, 29) ^ low == i << 32 | 0x1234_5678
                [high, high.rotate_left(29) ^ (i << 32 | 0x1234_5678)]
            })
            .collect();
        let unkeyed = BuildHasherDefault::<IdHasher>::default();
        assert!(
            ids.iter()
                .all(|id| unkeyed.hash_one(id) as u32 == 0x1234_5678)
        );
        let seeded = SeededIds::default();
        let low_bits: std::collections::HashSet<u64> =
            ids.iter().map(|id| seeded.hash_one(id) & 0xFFFF).collect();
        assert!(low_bits.len() > 950, "{} distinct", low_bits.len());
        assert_eq!(seeded.hash_one(ids[7]), seeded.hash_one(ids[7]));
    }

    #[test]
    fn byte_keys_that_differ_hash_apart() {
        let build = BuildHasherDefault::<BytesHasher>::default();
        let h = |k: &[u8]| build.hash_one(k);
        assert_ne!(h(b"ab"), h(b"ba"));
        assert_ne!(h(b""), h(b"\0"));
        assert_eq!(h(b"O0001234/2"), h(b"O0001234/2"));
    }
}
