//! Store directories on an in-memory disk: writing files in, reading them
//! back, and building valid stores with the real engine to start from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idemkv::storage::{CrashPolicy, FaultyStorage, OpenMode, Storage};
use idemkv::{Batch, Durability, ManualClock, OnConflict, Options, Store};

/// The store directory on every in-memory disk.
pub fn dir() -> PathBuf {
    PathBuf::from("/db")
}

/// File name of segment `id`.
pub fn segment_name(id: u32) -> String {
    format!("{id:010}.seg")
}

/// The segment id a file name stands for.
pub fn segment_id(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The clock reading every target starts from.
pub const START_MS: u64 = 1_750_000_000_000;

/// A new disk holding `files` (name, bytes) in [`dir`], all durable.
pub fn disk_with(files: &[(String, Vec<u8>)]) -> FaultyStorage {
    let storage = FaultyStorage::new();
    let dir = dir();
    storage.create_dir_all(&dir).expect("create dir");
    for (name, bytes) in files {
        let file = storage
            .open(&dir.join(name), OpenMode::CreateNew)
            .expect("create file");
        file.append(bytes).expect("write file");
        file.sync_data().expect("sync file");
    }
    storage.sync_dir(&dir).expect("sync dir");
    storage
}

/// Segment files and the snapshot of the store in [`dir`] on `storage`,
/// in name order (the lock file and anything else left out).
pub fn store_files(storage: &FaultyStorage) -> Vec<(String, Vec<u8>)> {
    let dir = dir();
    let mut names = storage.list_dir(&dir).expect("list");
    names.sort();
    names
        .into_iter()
        .filter(|n| n == "SNAPSHOT" || segment_id(n).is_some())
        .map(|n| {
            let bytes = storage.read_file(dir.join(&n)).expect("listed file");
            (n, bytes)
        })
        .collect()
}

/// Options for a store on `storage` with a manual clock, and segments of
/// 64 KiB: the in-memory disk holds the space a segment is extended by
/// ahead of its records (a quarter of the segment size), so 64 MiB segments
/// would cost every run a 4 MiB buffer.
pub fn options(storage: &FaultyStorage, clock: &ManualClock) -> Options {
    Options::default()
        .segment_bytes_max(64 << 10)
        .storage(Arc::new(storage.clone()))
        .clock(Arc::new(clock.clone()))
        .durability(Durability::Sync)
        .value_bytes_max(64)
        .seen_ttl(None)
        .batch_ttl(None)
        .tombstone_ttl(None)
}

/// A batch of every kind of delivery: puts, a delete, counter adds, a
/// redelivery, an invalid event and a checkpoint.
fn workload_batch(i: u64) -> Batch {
    let seq = i * 10 + 1;
    Batch::new(format!("B{i}"))
        .put(
            format!("e{i}a"),
            format!("k{}", i % 3),
            seq,
            format!("v{i}"),
        )
        .put(format!("e{i}b"), "k9", seq, "{\"n\":1}")
        .add(format!("e{i}c"), "visits", seq, i as i64 - 1)
        .delete(format!("e{i}d"), format!("k{}", (i + 1) % 3), seq + 1)
        .put(
            format!("e{i}a"),
            format!("k{}", i % 3),
            seq,
            format!("v{i}"),
        )
        .put(format!("e{i}e"), "", seq, "no key")
        .checkpoint("cdc", seq.to_be_bytes())
}

/// Which valid stores the seeds start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedStore {
    /// One segment and a snapshot of it.
    Closed,
    /// Three segments (small segments rotate), no snapshot.
    Rotated,
    /// A base segment from compaction, a log segment after it and a
    /// snapshot of both.
    Compacted,
    /// Two segments, and the last record of the newest torn.
    TornTail,
}

impl SeedStore {
    pub const ALL: [SeedStore; 4] = [
        SeedStore::Closed,
        SeedStore::Rotated,
        SeedStore::Compacted,
        SeedStore::TornTail,
    ];

    /// The store's files, as the real engine wrote them.
    pub fn files(self) -> Vec<(String, Vec<u8>)> {
        let storage = FaultyStorage::new();
        let clock = ManualClock::new(START_MS);
        let segment_bytes = match self {
            SeedStore::Closed => 64 << 10,
            _ => 700,
        };
        let opts = options(&storage, &clock)
            .segment_bytes_max(segment_bytes)
            .on_conflict(OnConflict::Quarantine);
        let store = Store::open(dir(), opts).expect("open a new store");
        let batches = match self {
            SeedStore::Closed => 3,
            SeedStore::Rotated => 5,
            SeedStore::Compacted | SeedStore::TornTail => 4,
        };
        for i in 1..=batches {
            clock.advance(std::time::Duration::from_millis(1_500));
            store.apply_batch(&workload_batch(i)).expect("seed batch");
            if self == SeedStore::Compacted && i == 3 {
                store.compact().expect("compact");
            }
        }
        match self {
            SeedStore::Closed => {
                store.snapshot().expect("snapshot");
                store.close().expect("close");
                store_files(&storage)
            }
            SeedStore::Compacted => {
                store.snapshot().expect("snapshot");
                let image = storage.crash_image(CrashPolicy::PowerLoss);
                drop(store);
                store_files(&image)
            }
            SeedStore::Rotated | SeedStore::TornTail => {
                let image = storage.crash_image(CrashPolicy::PowerLoss);
                drop(store);
                let mut files: Vec<_> = store_files(&image)
                    .into_iter()
                    .filter(|(n, _)| n != "SNAPSHOT")
                    .collect();
                if self == SeedStore::TornTail {
                    // Nine bytes off the last record, past the zeros after it.
                    let last = files.last_mut().expect("a segment");
                    let records_end = last.1.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                    last.1.truncate(records_end - 9);
                }
                files
            }
        }
    }
}

/// Whether `path` is in the store directory (not in `lost+found/`).
pub fn in_store_dir(path: &Path) -> bool {
    path.parent() == Some(dir().as_path())
}
