//! `open_store`: a store directory made of arbitrary bytes.
//!
//! Input layout (little-endian), chosen so that a seed made of a real store's
//! files stays meaningful under byte mutations:
//!
//! ```text
//! flags u8 | file count u8 | count x (name u8, length u16, bytes) | edits...
//! edit: op u8 | file u8 | offset u32 | value u8
//! ```
//!
//! A name below 0xF0 is that segment id; 0xF0 is `SNAPSHOT`, 0xF1 the
//! `SYNC_FAILED` marker, 0xF2 a leftover `0000000001.seg.tmp`, 0xF3 a
//! leftover `SNAPSHOT.tmp`. Edits are applied in order, and with flag bit 0
//! every checksum is mended afterwards, so that the damage reaches the
//! decoders and the index instead of stopping at a CRC.
//!
//! Then: `verify_dir`, `open` (reads, a batch, a reopen that must see the
//! same state), `repair`, and `open` again. Each answers `Ok` or an error
//! (`Corruption` or `Io`, or `UnsupportedFormat` for a header whose version
//! was edited and its checksum mended); a panic, a hang or a huge
//! allocation is a bug.
//! Contracts checked on top: what `verify_dir` passes, `open` opens; a
//! reopen of an opened store sees the same state and discards nothing; after
//! a successful `repair`, the store opens and verifies.

use idemkv::storage::FaultyStorage;
use idemkv::{Batch, Digest, Durability, Error, ManualClock, OnConflict, Options, Store};

use crate::image::{START_MS, dir, options, segment_id, segment_name};
use crate::layout;

/// Name byte of the snapshot.
pub const NAME_SNAPSHOT: u8 = 0xF0;
const NAME_SYNC_FAILED: u8 = 0xF1;
const NAME_SEGMENT_TMP: u8 = 0xF2;
const NAME_SNAPSHOT_TMP: u8 = 0xF3;

/// Flag bits.
pub const FLAG_MEND: u8 = 1;
pub const FLAG_BUFFERED: u8 = 2;
pub const FLAG_QUARANTINE: u8 = 4;
pub const FLAG_SMALL_SEGMENTS: u8 = 8;

const FILES_MAX: usize = 5;

/// One edit of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edit {
    pub op: u8,
    pub file: u8,
    pub offset: u32,
    pub value: u8,
}

/// Edit ops.
pub const EDIT_XOR: u8 = 0;
pub const EDIT_SET: u8 = 1;
pub const EDIT_TRUNCATE: u8 = 2;
pub const EDIT_INSERT: u8 = 3;
pub const EDIT_DELETE: u8 = 4;
pub const EDIT_SET_U32: u8 = 5;
pub const EDIT_DUPLICATE: u8 = 6;
pub const EDIT_REMOVE: u8 = 7;

/// A parsed input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    pub flags: u8,
    pub files: Vec<(u8, Vec<u8>)>,
    pub edits: Vec<Edit>,
}

fn file_name(name: u8) -> String {
    match name {
        NAME_SYNC_FAILED => "SYNC_FAILED".to_owned(),
        NAME_SEGMENT_TMP => format!("{}.tmp", segment_name(1)),
        NAME_SNAPSHOT_TMP => "SNAPSHOT.tmp".to_owned(),
        n if n >= NAME_SNAPSHOT => "SNAPSHOT".to_owned(),
        n => segment_name(u32::from(n)),
    }
}

/// The name byte of a store file name.
pub fn name_byte(name: &str) -> u8 {
    match segment_id(name) {
        Some(id) => u8::try_from(id).unwrap_or(0xEF).min(0xEF),
        None => NAME_SNAPSHOT,
    }
}

impl Input {
    pub fn parse(data: &[u8]) -> Input {
        let mut rest = data;
        let byte = |rest: &mut &[u8]| -> u8 {
            let (b, r) = rest.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
            *rest = r;
            b
        };
        let flags = byte(&mut rest);
        let count = 1 + usize::from(byte(&mut rest)) % FILES_MAX;
        let mut files = Vec::with_capacity(count);
        for _ in 0..count {
            let name = byte(&mut rest);
            let len = u16::from_le_bytes([byte(&mut rest), byte(&mut rest)]);
            let len = usize::from(len).min(rest.len());
            let (bytes, r) = rest.split_at(len);
            files.push((name, bytes.to_vec()));
            rest = r;
        }
        let edits = rest
            .chunks_exact(7)
            .map(|c| Edit {
                op: c[0],
                file: c[1],
                offset: u32::from_le_bytes([c[2], c[3], c[4], c[5]]),
                value: c[6],
            })
            .collect();
        Input {
            flags,
            files,
            edits,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.flags, (self.files.len().max(1) - 1) as u8];
        for (name, bytes) in &self.files {
            out.push(*name);
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        for e in &self.edits {
            out.extend_from_slice(&[e.op, e.file]);
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.push(e.value);
        }
        out
    }

    /// The directory's files after the edits: (name, bytes), later names
    /// replacing earlier ones.
    pub fn files_after_edits(&self) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(u8, Option<Vec<u8>>)> = self
            .files
            .iter()
            .map(|(n, b)| (*n, Some(b.clone())))
            .collect();
        for e in &self.edits {
            let i = usize::from(e.file) % files.len();
            let Some(bytes) = files[i].1.as_mut() else {
                continue;
            };
            let at = e.offset as usize % (bytes.len() + 1);
            match e.op % 8 {
                EDIT_XOR => {
                    if let Some(b) = bytes.get_mut(at) {
                        *b ^= e.value;
                    }
                }
                EDIT_SET => {
                    if let Some(b) = bytes.get_mut(at) {
                        *b = e.value;
                    }
                }
                EDIT_TRUNCATE => bytes.truncate(at),
                EDIT_INSERT => bytes.insert(at, e.value),
                EDIT_DELETE => {
                    let end = (at + usize::from(e.value)).min(bytes.len());
                    bytes.drain(at..end);
                }
                EDIT_SET_U32 => {
                    // A small number over a length, count or offset field.
                    let v = u32::from(e.value).to_le_bytes();
                    for (k, b) in v.iter().enumerate() {
                        if let Some(slot) = bytes.get_mut(at + k) {
                            *slot = *b;
                        }
                    }
                }
                EDIT_DUPLICATE => {
                    // The file again under another name (a segment id or the snapshot).
                    let copy = bytes.clone();
                    if files.len() < FILES_MAX + 2 {
                        files.push((e.value, Some(copy)));
                    }
                }
                _ => files[i].1 = None,
            }
        }
        let mut named: std::collections::BTreeMap<String, (u8, Vec<u8>)> = Default::default();
        for (name, bytes) in files {
            if let Some(bytes) = bytes {
                named.insert(file_name(name), (name, bytes));
            }
        }
        named
            .into_iter()
            .map(|(file, (name, mut bytes))| {
                if self.flags & FLAG_MEND != 0 {
                    let id = if name < NAME_SNAPSHOT {
                        u32::from(name)
                    } else {
                        0
                    };
                    layout::mend_checksums(&mut bytes, id);
                }
                (file, bytes)
            })
            .collect()
    }
}

fn store_options(storage: &FaultyStorage, clock: &ManualClock, flags: u8) -> Options {
    let mut opts = options(storage, clock);
    if flags & FLAG_BUFFERED != 0 {
        opts = opts.durability(Durability::Buffered);
    }
    if flags & FLAG_QUARANTINE != 0 {
        opts = opts.on_conflict(OnConflict::Quarantine);
    }
    if flags & FLAG_SMALL_SEGMENTS != 0 {
        opts = opts.segment_bytes_max(512);
    }
    opts
}

/// An error that a damaged directory may give.
pub(crate) fn expected(what: &str, e: &Error) {
    match e {
        Error::Corruption { .. } | Error::Io { .. } | Error::UnsupportedFormat { .. } => {}
        other => panic!("{what}: unexpected error {other:?}"),
    }
}

/// Everything a reader sees of an open store, or the first read error.
type Observed = Result<
    (
        Digest,
        Vec<(bytes::Bytes, idemkv::Record)>,
        Vec<(bytes::Bytes, bytes::Bytes)>,
    ),
    String,
>;

fn observe(store: &Store) -> Observed {
    let digest = store.digest().map_err(|e| e.to_string())?;
    let rows = store
        .scan_prefix(b"")
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok((digest, rows, store.checkpoints()))
}

/// Reads everything, applies one batch, reopens: the reopened store must
/// see what the first one saw.
fn exercise(store: Store, opts: &Options, clock: &ManualClock) {
    let before = observe(&store);
    for key in ["k0", "k1", "k9", "visits", ""] {
        if let Err(e) = store.get(key) {
            expected("get", &e);
        }
    }
    let _ = store.stats();
    let _ = store.log();
    let _ = store.quarantine();
    let _ = store.checkpoint("cdc");
    if let Err(e) = store.verify() {
        expected("verify an open store", &e);
    }
    clock.advance(std::time::Duration::from_secs(1));
    let batch = Batch::new("fuzz-open")
        .put("fz1", "k0", 1 << 40, "after open")
        .add("fz2", "visits", 1 << 40, 1)
        .delete("fz3", "k1", 1 << 40)
        .checkpoint("cdc", [0xff; 8]);
    match store.apply_batch(&batch) {
        // A damaged store may hold the counter as text, claim to have seen
        // an id, or know the batch id with other content.
        Ok(_)
        | Err(
            Error::InvalidEvent { .. }
            | Error::ConflictingEvent { .. }
            | Error::BatchConflict { .. },
        ) => {}
        Err(e) => expected("apply_batch on an opened store", &e),
    }
    let after = observe(&store);
    drop(store);
    let store = match Store::open(dir(), opts.clone()) {
        Ok(store) => store,
        Err(e) => panic!("a store that opened does not open again: {e}"),
    };
    assert_eq!(
        store.stats().torn_bytes_discarded,
        0,
        "the second open discards bytes the first kept"
    );
    if before.is_ok() && after.is_ok() {
        assert_eq!(observe(&store), after, "a reopen changes the state");
    }
}

/// Opens the directory and `exercise`s the store; an open that fails must
/// fail with an error a damaged directory may give, and only where
/// `verify_dir` failed too (`verified` says whether it passed).
pub(crate) fn open_and_exercise(verified: bool, opts: &Options, clock: &ManualClock) {
    match Store::open(dir(), opts.clone()) {
        Ok(store) => exercise(store, opts, clock),
        Err(e) => {
            expected("open", &e);
            assert!(
                !verified,
                "verify_dir passed a directory that open refuses: {e}"
            );
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let input = Input::parse(data);
    let files = input.files_after_edits();
    let storage = crate::image::disk_with(&files);
    let clock = ManualClock::new(START_MS + 3_600_000);
    let opts = store_options(&storage, &clock, input.flags);

    let verified = Store::verify_dir(dir(), &opts);
    if let Err(e) = &verified {
        expected("verify_dir", e);
    }
    open_and_exercise(verified.is_ok(), &opts, &clock);

    clock.advance(std::time::Duration::from_secs(1));
    match Store::repair(dir(), opts.clone()) {
        Ok(report) => {
            let store = Store::open(dir(), opts.clone())
                .unwrap_or_else(|e| panic!("open after repair ({report:?}): {e}"));
            drop(store);
            if let Err(e) = Store::verify_dir(dir(), &opts) {
                panic!("verify_dir after repair ({report:?}) and open: {e}");
            }
        }
        Err(e) => expected("repair", &e),
    }
}
