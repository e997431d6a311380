//! Appends records to the active segment, rotating to a new segment when it
//! is full (DESIGN.md, "File lifecycle").
//!
//! The writer owns one reusable buffer: a record is encoded straight into it
//! behind room for its frame header, placed (framed, rotating first if need
//! be), checked by the caller, then written with one `write_at`. The caller
//! serialises access (the store's writer lock).
//!
//! The active segment is extended ahead of its records, a quarter of the
//! segment size (at most 4 MiB) at a time, so that most commit syncs find
//! the file's size unchanged and write data only (an fdatasync after an
//! append must also write the new size). The unused part reads as zeros,
//! which the reader takes for the end of the newest segment (DESIGN.md,
//! "Preallocated segments"). When commits sync, that part is also filled
//! with zeros ahead of the records (`zero_fill.rs`), so that their syncs
//! find the blocks allocated too.
//!
//! Rotation, in order: cut the full segment to the end of its last record
//! and sync it (it is now sealed and never written again), create the next
//! segment with its header, extended, sync it, sync the directory. Every
//! segment but the newest is therefore whole on disk and ends at a record.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::names::segment_file_name;
use super::sync_gate::SyncGate;
use super::zero_fill::{Reach, ZeroFill};
use crate::error::{Error, Result};
use crate::format::segment::{
    FRAME_HEADER_LEN, FileKind, SEGMENT_HEADER_LEN, encode_frame, encode_segment_header,
};
use crate::storage::{OpenMode, Storage, StorageFile};

/// The page size that write-back works in (4 KiB on the platforms that
/// have one to start; a larger page only makes the range a hint covers
/// reach into the next record's page).
const WRITE_BACK_PAGE: u64 = 4096;

/// The most the active segment is extended by at a time.
const PREALLOCATE_BYTES_MAX: u64 = 4 << 20;

/// The largest record buffer the writer keeps for the next record: far
/// above a batch of a thousand 1 KiB values, far below a batch that is
/// mostly one huge value.
const BUFFER_KEPT_BYTES: usize = 16 << 20;

/// The length to extend a segment to so that a record ending at `end` fits:
/// the next multiple of a quarter of the segment size (at most
/// `PREALLOCATE_BYTES_MAX`), short of the size limit, where a record that
/// does not fit rotates to a new segment anyway unless it is alone in its
/// segment.
fn extent_for(end: u64, allocated: u64, segment_bytes_max: u64) -> u64 {
    let step = extension_step(segment_bytes_max);
    ((allocated / step + 1) * step)
        .min(segment_bytes_max)
        .max(end)
}

/// How much the active segment is extended by at a time.
fn extension_step(segment_bytes_max: u64) -> u64 {
    (segment_bytes_max / 4).clamp(1, PREALLOCATE_BYTES_MAX)
}

/// Creates segment `id` with its header, extended to `len` bytes, durably
/// (file and directory synced).
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    id: u32,
    len: u64,
) -> Result<Arc<dyn StorageFile>> {
    let path = dir.join(segment_file_name(id));
    let file = storage
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &path, e))?;
    file.append(&encode_segment_header(id, FileKind::Log))
        .map_err(|e| Error::io("write", &path, e))?;
    if len > SEGMENT_HEADER_LEN as u64 {
        file.set_len(len)
            .map_err(|e| Error::io("extend", &path, e))?;
    }
    file.sync_data().map_err(|e| Error::io("sync", &path, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    Ok(file)
}

/// The length a new segment is created with.
pub(crate) fn new_segment_len(segment_bytes_max: u64) -> u64 {
    extent_for(
        SEGMENT_HEADER_LEN as u64,
        SEGMENT_HEADER_LEN as u64,
        segment_bytes_max,
    )
}

/// Where a record goes.
#[derive(Debug)]
pub(crate) struct Placed {
    pub segment: u32,
    /// Offset of the record's frame in its segment.
    pub offset: u32,
    /// Offset of the record's body in its segment.
    pub body_at: u32,
    pub record_len: u64,
    /// Log sequence number before the record (bytes appended since open).
    pub lsn_start: u64,
    /// Set when placing started a new segment; everything before
    /// `lsn_start` was synced when the old one was sealed.
    pub new_segment: Option<Arc<dyn StorageFile>>,
}

/// The append side of the log.
#[derive(Debug)]
pub(crate) struct LogWriter {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    segment_bytes_max: u64,
    active: Arc<dyn StorageFile>,
    active_id: u32,
    /// Where the active segment's records end.
    active_len: u64,
    /// The active segment's file length: zeros from `active_len` on.
    allocated: u64,
    /// A position known in both coordinates: log sequence number `.0` is
    /// offset `.1` of the active segment. Turns a durable lsn into the
    /// `synced_to` offset that frames carry.
    active_anchor: (u64, u64),
    lsn: u64,
    buf: Vec<u8>,
    /// Every sync of the active segment, group commit's included.
    sync_gate: Arc<SyncGate>,
    /// Fills the active segment with zeros ahead of the records, when
    /// commits sync.
    zero_fill: Option<ZeroFill>,
}

impl LogWriter {
    /// A writer appending to segment `active_id` after its records, which
    /// end at `active_len` in a file `allocated` bytes long; with
    /// `zero_fill`, filling the file with zeros ahead of them.
    ///
    /// # Errors
    /// `Io` if the filler's handle of the active segment does not open.
    #[expect(clippy::too_many_arguments, reason = "one call site, in open")]
    pub(crate) fn new(
        dir: PathBuf,
        storage: Arc<dyn Storage>,
        segment_bytes_max: u64,
        active: Arc<dyn StorageFile>,
        active_id: u32,
        active_len: u64,
        allocated: u64,
        zero_fill: bool,
    ) -> Result<Self> {
        assert!(
            active_len >= SEGMENT_HEADER_LEN as u64,
            "active segment has its header"
        );
        let mut writer = Self {
            dir,
            storage,
            segment_bytes_max,
            active,
            active_id,
            active_len,
            allocated: allocated.max(active_len),
            active_anchor: (0, active_len),
            lsn: 0,
            buf: Vec::new(),
            sync_gate: Arc::default(),
            zero_fill: None,
        };
        if zero_fill {
            let reach = Reach::new(extension_step(segment_bytes_max));
            let is_background = writer.storage.allows_background_io();
            let file = writer.filler_handle()?;
            let fill = ZeroFill::start(file, active_len, writer.allocated, reach, is_background);
            if is_background {
                writer.sync_gate = Arc::new(SyncGate::new(Some(Box::new(fill.cue()))));
            }
            writer.zero_fill = Some(fill);
        }
        Ok(writer)
    }

    /// A handle of the active segment for the filler's own syncs (see
    /// `zero_fill.rs`).
    fn filler_handle(&self) -> Result<Arc<dyn StorageFile>> {
        let path = self.dir.join(segment_file_name(self.active_id));
        self.storage
            .open(&path, OpenMode::Append)
            .map_err(|e| Error::io("open", path, e))
    }

    /// The gate every sync of the active segment passes (see `sync_gate.rs`).
    pub(crate) fn sync_gate(&self) -> &Arc<SyncGate> {
        &self.sync_gate
    }

    /// Hands out the reusable buffer, cleared, with room for a frame header
    /// in front: encode the record body after it. Give it back with `finish`.
    pub(crate) fn begin(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.resize(FRAME_HEADER_LEN, 0);
        buf
    }

    /// Takes the buffer back for the next record, unless it grew past
    /// `BUFFER_KEPT_BYTES` (one huge batch would otherwise hold that much
    /// memory for the store's life).
    pub(crate) fn finish(&mut self, buf: Vec<u8>) {
        if buf.capacity() <= BUFFER_KEPT_BYTES {
            self.buf = buf;
        }
    }

    /// The file records are appended to now.
    pub(crate) fn active_file(&self) -> &Arc<dyn StorageFile> {
        &self.active
    }

    /// Decides where the record in `buf` goes (rotating first if the active
    /// segment is full) and writes its frame header.
    ///
    /// `durable_lsn` is how far the log is synced, when syncs are what make
    /// batches durable; `None` (buffered) makes the frame claim everything
    /// before it as written for good, so that recovery treats any damage
    /// before it as corruption rather than as a write cut short.
    pub(crate) fn place(
        &mut self,
        buf: &mut [u8],
        kind: u8,
        durable_lsn: Option<u64>,
    ) -> Result<Placed> {
        let record_len = buf.len() as u64;
        let is_full = self.active_len + record_len > self.segment_bytes_max
            || self.active_len + record_len > u64::from(u32::MAX);
        let new_segment = if is_full && self.active_len > SEGMENT_HEADER_LEN as u64 {
            Some(self.rotate()?)
        } else {
            None
        };
        let offset = u32::try_from(self.active_len)
            .expect("segment offsets fit in u32 (rotation keeps them so)");
        let (anchor_lsn, anchor_offset) = self.active_anchor;
        let synced_to = match durable_lsn.map(|lsn| lsn.checked_sub(anchor_lsn)) {
            None => u64::from(offset),
            Some(Some(past)) => (anchor_offset + past).min(u64::from(offset)),
            Some(None) => SEGMENT_HEADER_LEN as u64,
        };
        let synced_to = u32::try_from(synced_to).expect("at most the record's own offset");
        let (header, body) = buf.split_at_mut(FRAME_HEADER_LEN);
        encode_frame(header, kind, body, self.active_id, offset, synced_to);
        Ok(Placed {
            segment: self.active_id,
            offset,
            body_at: offset + FRAME_HEADER_LEN as u32,
            record_len,
            lsn_start: self.lsn,
            new_segment,
        })
    }

    /// Writes a record framed by `place` after the last one, extending the
    /// segment first if it ends before the record would; returns the
    /// position after it.
    ///
    /// On error the record may be partly written; the caller must refuse
    /// further writes (a later record after a partial one would turn a torn
    /// tail into corruption).
    pub(crate) fn write(&mut self, buf: &[u8], placed: &Placed) -> Result<u64> {
        assert_eq!(
            (u64::from(placed.offset), placed.record_len),
            (self.active_len, buf.len() as u64),
            "a record is written where it was placed"
        );
        let path = || self.dir.join(segment_file_name(self.active_id));
        let end = self.active_len + placed.record_len;
        // Filling needs room ahead of the records: a step of it.
        let lead = match self.zero_fill {
            Some(_) => extension_step(self.segment_bytes_max),
            None => 0,
        };
        let wanted = (end + lead).min(self.segment_bytes_max).max(end);
        if wanted > self.allocated {
            let len = extent_for(wanted, self.allocated, self.segment_bytes_max);
            self.active
                .set_len(len)
                .map_err(|e| Error::io("extend", path(), e))?;
            self.allocated = len;
            if let Some(fill) = &self.zero_fill {
                fill.extended(len);
            }
        }
        if let Some(fill) = &self.zero_fill {
            fill.will_write(self.active_len..end);
        }
        self.active
            .write_at(self.active_len, buf)
            .map_err(|e| Error::io("append", path(), e))?;
        self.active_len += placed.record_len;
        self.lsn += placed.record_len;
        Ok(self.lsn)
    }

    /// Starts writing the record `place`d at `placed` back to the disk (see
    /// `StorageFile::start_write_back`), ahead of the sync that makes it
    /// durable: from the page that holds its start to its last whole page.
    /// Not its last, partial page: the next record writes into that one,
    /// and a write to a page under write-back may have to wait for it.
    pub(crate) fn start_write_back(&self, placed: &Placed) {
        let start = u64::from(placed.offset) / WRITE_BACK_PAGE * WRITE_BACK_PAGE;
        let end =
            (u64::from(placed.offset) + placed.record_len) / WRITE_BACK_PAGE * WRITE_BACK_PAGE;
        if end > start {
            self.active.start_write_back(start, end - start);
        }
    }

    /// Where the next record goes: active segment id and offset, and the
    /// log sequence number (everything before it is in the sealed segments
    /// and the active one).
    pub(crate) fn position(&self) -> (u32, u64, u64) {
        (self.active_id, self.active_len, self.lsn)
    }

    /// Cuts the active segment's unused extension off (left unsynced: a
    /// power loss that brings it back leaves zeros, which read as the end).
    pub(crate) fn trim(&mut self) -> Result<()> {
        if self.allocated > self.active_len {
            let path = self.dir.join(segment_file_name(self.active_id));
            if let Some(fill) = &self.zero_fill {
                fill.will_truncate(self.active_len);
            }
            self.active
                .set_len(self.active_len)
                .map_err(|e| Error::io("truncate", &path, e))?;
            self.allocated = self.active_len;
        }
        Ok(())
    }

    /// Seals the active segment and starts the next one.
    pub(crate) fn rotate(&mut self) -> Result<Arc<dyn StorageFile>> {
        let path = self.dir.join(segment_file_name(self.active_id));
        self.trim()?;
        self.sync_gate
            .sync(self.active.as_ref())
            .map_err(|e| Error::io("sync", &path, e))?;
        let next_id = self.active_id.checked_add(1).ok_or_else(|| {
            Error::io(
                "rotate",
                &path,
                std::io::Error::other("segment ids exhausted"),
            )
        })?;
        let len = new_segment_len(self.segment_bytes_max);
        let file = create_segment(self.storage.as_ref(), &self.dir, next_id, len)?;
        self.active = Arc::clone(&file);
        self.active_id = next_id;
        self.active_len = SEGMENT_HEADER_LEN as u64;
        self.allocated = len;
        self.active_anchor = (self.lsn, self.active_len);
        if let Some(fill) = &self.zero_fill {
            fill.switch_to(self.filler_handle()?, self.active_len, len);
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_record_s_buffer_is_not_kept_for_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(crate::storage::OsStorage);
        let segment_bytes_max = 1 << 20;
        let len = new_segment_len(segment_bytes_max);
        let file = create_segment(storage.as_ref(), dir.path(), 1, len).unwrap();
        let header = SEGMENT_HEADER_LEN as u64;
        let mut writer = LogWriter::new(
            dir.path().to_owned(),
            storage,
            segment_bytes_max,
            file,
            1,
            header,
            len,
            false,
        )
        .unwrap();
        // Writes a record of `bytes` into the buffer; the next record's room.
        let mut grow = |bytes: usize| {
            let mut buf = writer.begin();
            buf.resize(bytes, 7);
            writer.finish(buf);
            let next = writer.begin();
            let room = next.capacity();
            writer.finish(next);
            room
        };
        assert!(
            grow(1 << 20) >= 1 << 20,
            "an ordinary record's buffer is kept"
        );
        assert!(grow(BUFFER_KEPT_BYTES + 1) < 1 << 20, "a huge one's is not");
    }
}
