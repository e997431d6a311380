//! Iterates the records of one mapped segment and tells a torn tail from
//! corruption (DESIGN.md, "Reader rules").
//!
//! | case at offset `o`                                  | outcome                 |
//! |-----------------------------------------------------|-------------------------|
//! | `o` is the end of the file                          | clean end               |
//! | fewer than a frame header's bytes remain            | torn                    |
//! | valid header, body runs past the end of the file    | torn                    |
//! | bad header or bad body checksum, a later valid frame| corruption              |
//! | bad header or bad body checksum, no later frame     | torn                    |
//! | valid frame of an unknown kind                      | corruption              |
//!
//! "Torn" is only acceptable in the newest segment; the caller turns it into
//! corruption anywhere else.

use crate::format::record::KIND_BATCH;
use crate::format::segment::{FRAME_HEADER_LEN, Frame, SEGMENT_HEADER_LEN, decode_frame};
use crate::format::state::KIND_END;

/// One whole record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordRef<'a> {
    pub kind: u8,
    /// Offset of the frame header in the segment.
    pub offset: u32,
    /// Offset of the body in the segment.
    pub body_at: u32,
    pub body: &'a [u8],
}

/// Why the records stop before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRecord {
    pub offset: u64,
    pub reason: &'static str,
    /// No valid record follows: this may be a write cut short by a crash.
    pub is_tail: bool,
}

/// Iterates the records after the segment header.
#[derive(Debug)]
pub(crate) struct SegmentReader<'a> {
    map: &'a [u8],
    segment_id: u32,
    pos: usize,
    done: bool,
}

impl<'a> SegmentReader<'a> {
    /// A reader over a segment whose header the caller has already checked.
    pub(crate) fn new(map: &'a [u8], segment_id: u32) -> Self {
        Self::starting_at(map, segment_id, SEGMENT_HEADER_LEN)
    }

    /// A reader that starts at `offset`, which the caller knows to be a
    /// record boundary (from a snapshot).
    pub(crate) fn starting_at(map: &'a [u8], segment_id: u32, offset: usize) -> Self {
        Self {
            map,
            segment_id,
            pos: offset.max(SEGMENT_HEADER_LEN),
            done: false,
        }
    }

    /// Offset just after the last record returned.
    pub(crate) fn position(&self) -> u64 {
        self.pos as u64
    }

    fn frame_at(&self, at: usize) -> Option<Frame> {
        let offset = u32::try_from(at).ok()?;
        decode_frame(self.map.get(at..)?, self.segment_id, offset)
    }

    /// Whether any valid frame header starts after `at`.
    fn has_frame_after(&self, at: usize) -> bool {
        let last = self.map.len().saturating_sub(FRAME_HEADER_LEN);
        (at + 1..=last).any(|p| self.frame_at(p).is_some())
    }

    fn bad(&mut self, reason: &'static str, may_be_tail: bool) -> BadRecord {
        self.done = true;
        let is_tail = may_be_tail && !self.has_frame_after(self.pos);
        BadRecord {
            offset: self.pos as u64,
            reason,
            is_tail,
        }
    }
}

impl<'a> Iterator for SegmentReader<'a> {
    type Item = Result<RecordRef<'a>, BadRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.pos >= self.map.len() {
            return None;
        }
        let remaining = self.map.len() - self.pos;
        if remaining < FRAME_HEADER_LEN {
            return Some(Err(self.bad("incomplete record header", true)));
        }
        let Some(frame) = self.frame_at(self.pos) else {
            return Some(Err(self.bad("record header checksum mismatch", true)));
        };
        let body_at = self.pos + FRAME_HEADER_LEN;
        let body_len = frame.body_len as usize;
        let Some(body) = self.map.get(body_at..body_at.saturating_add(body_len)) else {
            self.done = true;
            return Some(Err(BadRecord {
                offset: self.pos as u64,
                reason: "incomplete record body",
                is_tail: true,
            }));
        };
        if crc32fast::hash(body) != frame.body_crc {
            return Some(Err(self.bad("record body checksum mismatch", true)));
        }
        if !(KIND_BATCH..=KIND_END).contains(&frame.kind) {
            return Some(Err(self.bad("unknown record kind", false)));
        }
        let Some(body_at_u32) = frame.offset.checked_add(FRAME_HEADER_LEN as u32) else {
            return Some(Err(self.bad("record beyond 4 GiB", false)));
        };
        let record = RecordRef {
            kind: frame.kind,
            offset: frame.offset,
            body_at: body_at_u32,
            body,
        };
        self.pos = body_at + body_len;
        Some(Ok(record))
    }
}
