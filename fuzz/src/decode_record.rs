//! `decode_record`: arbitrary bytes into the frame and segment header
//! decoders, and arbitrary record bodies into the batch and state record
//! decoders.
//!
//! The decoders are private to the engine, so the bytes reach them the way
//! they do in production: as files that `verify_dir` (and, with flag bit 0,
//! `open`) reads. Bodies are wrapped in frames whose checksums hold, so that
//! every body reaches its decoder.
//!
//! Input layout:
//!
//! ```text
//! container u8 | flags u8 | payload
//! ```
//!
//! | container | payload                                  | file(s)                                      |
//! |-----------|------------------------------------------|----------------------------------------------|
//! | 0         | raw bytes                                | segment 1                                    |
//! | 1         | raw bytes                                | `SNAPSHOT`, beside a valid segment 1         |
//! | 2         | records: kind u8, length u16, body       | a log segment 1 holding them                 |
//! | 3         | records                                  | a base segment 1 holding them                |
//! | 4         | records                                  | `SNAPSHOT` holding them, beside a valid log  |
//!
//! Flag bit 1: every frame claims the segment synced up to itself (a bad
//! record before it is then corruption rather than a torn tail).

use std::sync::OnceLock;

use idemkv::{ManualClock, Store};

use crate::image::{START_MS, SeedStore, dir, disk_with, options, segment_name};
use crate::layout::{self, FileKind, SEGMENT_HEADER_LEN};
use crate::open_store::{expected, open_and_exercise};

pub const CONTAINER_RAW_SEGMENT: u8 = 0;
pub const CONTAINER_RAW_SNAPSHOT: u8 = 1;
pub const CONTAINER_LOG: u8 = 2;
pub const CONTAINER_BASE: u8 = 3;
pub const CONTAINER_SNAPSHOT: u8 = 4;

pub const FLAG_OPEN: u8 = 1;
pub const FLAG_SYNCED: u8 = 2;

/// The log segment of a valid closed store, for snapshots to refer to.
pub fn valid_log() -> &'static [u8] {
    static LOG: OnceLock<Vec<u8>> = OnceLock::new();
    LOG.get_or_init(|| {
        SeedStore::Closed
            .files()
            .into_iter()
            .find(|(n, _)| *n == segment_name(1))
            .expect("segment 1")
            .1
    })
}

/// Splits a payload into records: kind u8, length u16, body (cut short at the end).
pub fn split_records(mut payload: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while let [kind, lo, hi, rest @ ..] = payload {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        let (body, r) = rest.split_at(len);
        out.push((*kind, body));
        payload = r;
    }
    out
}

/// The payload that [`split_records`] splits back into `records`.
pub fn join_records(records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, body) in records {
        out.push(*kind);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(body);
    }
    out
}

fn framed(id: u32, kind: FileKind, records: &[(u8, &[u8])], synced: bool) -> Vec<u8> {
    let mut file = layout::segment_header(id, kind).to_vec();
    for (k, body) in records {
        let synced_to = if synced {
            u32::try_from(file.len()).unwrap_or(u32::MAX)
        } else {
            SEGMENT_HEADER_LEN as u32
        };
        layout::push_frame(&mut file, id, *k, body, synced_to);
    }
    file
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let [container, flags, payload @ ..] = data else {
        return;
    };
    let synced = flags & FLAG_SYNCED != 0;
    let log = || (segment_name(1), valid_log().to_vec());
    let files = match container % 5 {
        CONTAINER_RAW_SEGMENT => vec![(segment_name(1), payload.to_vec())],
        CONTAINER_RAW_SNAPSHOT => vec![log(), ("SNAPSHOT".to_owned(), payload.to_vec())],
        CONTAINER_LOG => vec![(
            segment_name(1),
            framed(1, FileKind::Log, &split_records(payload), synced),
        )],
        CONTAINER_BASE => vec![(
            segment_name(1),
            framed(1, FileKind::Base, &split_records(payload), synced),
        )],
        _ => vec![
            log(),
            (
                "SNAPSHOT".to_owned(),
                framed(0, FileKind::Snapshot, &split_records(payload), synced),
            ),
        ],
    };
    let storage = disk_with(&files);
    let clock = ManualClock::new(START_MS + 3_600_000);
    let opts = options(&storage, &clock);
    let verified = Store::verify_dir(dir(), &opts);
    if let Err(e) = &verified {
        expected("verify_dir", e);
    }
    // With flag bit 0, `open_store`'s contracts on top of the decoders':
    // what `verify_dir` passes, `open` opens, and a reopen sees the same.
    if flags & FLAG_OPEN != 0 {
        open_and_exercise(verified.is_ok(), &opts, &clock);
    }
}
