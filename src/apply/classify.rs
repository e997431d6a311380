//! Per-delivery facts that do not depend on state: hashes and static validity.

use std::borrow::Cow;

use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128};

use crate::batch::{Batch, Delivery, Op};
use crate::format::ID_BYTES_MAX;

/// The two hashes of a delivery: its event id and its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeliveryHash {
    /// xxh3-128 of the event id: the seen index's key.
    pub id: u128,
    /// 64-bit hash of key, seq and op (with value or delta): tells a
    /// redelivery from a conflicting reuse of the id.
    pub payload: u64,
}

/// Spreads an op's tag over 64 bits (the golden ratio's odd multiplier):
/// the tags' constants differ in about half their bits.
const TAG_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

fn op_tag(op: &Op) -> u64 {
    match op {
        Op::Put(_) => 1,
        Op::Delete => 2,
        Op::Add(_) => 3,
        Op::Malformed { .. } => 4,
    }
}

/// Hashes one delivery.
pub(crate) fn hash_delivery(d: &Delivery) -> DeliveryHash {
    // The key hashed under the seq, and the op's tag mixed into the result
    // as a constant of its own: two (seq, op) pairs share a head only when
    // two xxh3 outputs differ by the constants' difference, by chance. With
    // the tag xored into the seq's top byte, a Put at seq s and an Add at
    // s ^ 2 << 56 shared a seed, and a Put whose value was the delta's 8
    // bytes then had the Add's payload hash.
    let head = xxh3_64_with_seed(&d.key, d.seq) ^ op_tag(&d.op).wrapping_mul(TAG_MIX);
    let payload = match &d.op {
        Op::Put(value) => xxh3_64_with_seed(value, head),
        Op::Delete => head,
        Op::Add(delta) => xxh3_64_with_seed(&delta.to_le_bytes(), head),
        Op::Malformed { reason } => xxh3_64_with_seed(reason.as_bytes(), head),
    };
    DeliveryHash {
        id: xxh3_128(&d.event_id),
        payload,
    }
}

/// Hashes every delivery, and the batch's content (deliveries in order, then
/// checkpoints) from those hashes.
pub(crate) fn hash_batch(batch: &Batch) -> (u128, Vec<DeliveryHash>) {
    let hashes: Vec<DeliveryHash> = batch.deliveries().iter().map(hash_delivery).collect();
    // One buffer hashed at once: the same hash as feeding the pieces to a
    // streaming hasher, without a call per 8 or 16 bytes (half the cost
    // of hashing a batch of 1,000 deliveries).
    let checkpoint_bytes: usize = batch
        .checkpoints()
        .iter()
        .map(|(s, p)| 16 + s.len() + p.len())
        .sum();
    let mut content = Vec::with_capacity(8 + hashes.len() * 24 + checkpoint_bytes);
    content.extend_from_slice(&(hashes.len() as u64).to_le_bytes());
    for h in &hashes {
        content.extend_from_slice(&h.id.to_le_bytes());
        content.extend_from_slice(&h.payload.to_le_bytes());
    }
    for (source, position) in batch.checkpoints() {
        content.extend_from_slice(&(source.len() as u64).to_le_bytes());
        content.extend_from_slice(source);
        content.extend_from_slice(&(position.len() as u64).to_le_bytes());
        content.extend_from_slice(position);
    }
    (xxh3_128(&content), hashes)
}

/// Why a delivery can never be applied, whatever the state and the
/// options; `None` if it may be. Such a delivery has no identity to look up.
pub(crate) fn static_problem(d: &Delivery) -> Option<Cow<'static, str>> {
    let problem: Cow<'static, str> = if let Op::Malformed { reason } = &d.op {
        // An empty reason would leave the error and the quarantine entry
        // naming no problem at all.
        if reason.is_empty() {
            "malformed delivery".into()
        } else {
            Cow::Owned(reason.clone())
        }
    } else if d.event_id.is_empty() {
        "empty event id".into()
    } else if d.event_id.len() > ID_BYTES_MAX {
        format!(
            "event id of {} bytes exceeds {ID_BYTES_MAX}",
            d.event_id.len()
        )
        .into()
    } else if d.key.is_empty() {
        "empty key".into()
    } else if d.key.len() > ID_BYTES_MAX {
        format!("key of {} bytes exceeds {ID_BYTES_MAX}", d.key.len()).into()
    } else {
        return None;
    };
    Some(problem)
}

/// A `Put` value over the store's limit. Asked only of an event not seen
/// before: the limit is an option of this open, and an event applied under
/// a higher one is still a duplicate when it is redelivered.
pub(crate) fn value_problem(d: &Delivery, value_bytes_max: usize) -> Option<String> {
    match &d.op {
        Op::Put(value) if value.len() > value_bytes_max => Some(format!(
            "value of {} bytes exceeds the limit of {value_bytes_max}",
            value.len()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(id: &str, key: &str, seq: u64, op: Op) -> Delivery {
        Delivery {
            event_id: id.as_bytes().to_vec().into(),
            key: key.as_bytes().to_vec().into(),
            seq,
            op,
        }
    }

    #[test]
    fn payload_hash_covers_key_seq_op_and_value() {
        let base = delivery("e", "k", 1, Op::Put("v".into()));
        let h = hash_delivery(&base).payload;
        for other in [
            delivery("e", "k2", 1, Op::Put("v".into())),
            delivery("e", "k", 2, Op::Put("v".into())),
            delivery("e", "k", 1, Op::Put("w".into())),
            delivery("e", "k", 1, Op::Delete),
            delivery("e", "k", 1, Op::Add(1)),
        ] {
            assert_ne!(hash_delivery(&other).payload, h, "{other:?}");
        }
        assert_eq!(
            hash_delivery(&delivery("other id", "k", 1, Op::Put("v".into()))).payload,
            h
        );
    }

    #[test]
    fn no_op_and_seq_pair_shares_a_payload_hash_with_another_by_construction() {
        // Seqs that differ only in the top byte, where the op's tag went.
        let delta: i64 = 5;
        for seq in [1, 1 << 56, 1_789_948_800_000_000_000] {
            let put = delivery("e", "k", seq, Op::Put(delta.to_le_bytes().to_vec().into()));
            for flip in 1..=7u64 {
                let other_seq = seq ^ (flip << 56);
                for op in [Op::Add(delta), Op::Delete] {
                    let other = delivery("e", "k", other_seq, op);
                    assert_ne!(
                        hash_delivery(&other).payload,
                        hash_delivery(&put).payload,
                        "{other:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn static_problems_are_named() {
        let cases = [
            (delivery("", "k", 1, Op::Delete), "empty event id"),
            (delivery("e", "", 1, Op::Delete), "empty key"),
            (
                delivery("e", &"k".repeat(4097), 1, Op::Delete),
                "key of 4097 bytes",
            ),
        ];
        for (d, want) in cases {
            let got = static_problem(&d).expect("invalid");
            assert!(got.contains(want), "{got} should name {want}");
        }
        let long = delivery("e", "k", 1, Op::Put(vec![0; 11].into()));
        assert!(
            static_problem(&long).is_none(),
            "the value limit is not static"
        );
        let got = value_problem(&long, 10).expect("over the limit");
        assert!(got.contains("value of 11 bytes"), "{got}");
        assert!(value_problem(&long, 11).is_none());
    }
}
