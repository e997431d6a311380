//! A base segment's values, read ahead of the walk that writes them.
//!
//! A base holds every live value inline, and compaction reads each one
//! from wherever it lies in the log: one `read_at` per value, scattered
//! over the segments (a map would keep their pages resident). Those reads
//! are most of a compaction's time, the kernel finding each page and
//! copying from it cold, and they need nothing from each other: so the
//! values are read a chunk at a time, the chunk split between the writing
//! thread and one more, and handed out in key order.
//!
//! A storage that wants its I/O on the caller's thread (the fault tests')
//! gets every read there, each just before its value is written, so that
//! its operations come in the same order as without reading ahead.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::error::Result;
use crate::log::segments::ValueRef;

/// Reads one value.
pub(crate) type ReadValue<'a> = &'a (dyn Fn(ValueRef) -> Result<Bytes> + Sync);

/// Values read per chunk, at most, and bytes at most (a chunk holds at
/// least one value, however large).
const CHUNK_VALUES: usize = 4096;
const CHUNK_BYTES: u64 = 4 << 20;

/// The values of `refs`, in their order.
pub(crate) struct ReadAhead<'a, I> {
    refs: I,
    read: ReadValue<'a>,
    /// A second thread may take half of each chunk.
    is_parallel: bool,
    ready: VecDeque<(ValueRef, Result<Bytes>)>,
}

impl<'a, I: Iterator<Item = ValueRef>> ReadAhead<'a, I> {
    pub(crate) fn new(refs: I, read: ReadValue<'a>, is_parallel: bool) -> Self {
        Self {
            refs,
            read,
            is_parallel,
            ready: VecDeque::new(),
        }
    }

    /// The value of `v`, which must be the next of `refs`.
    ///
    /// # Panics
    /// If asked for more values than `refs` holds.
    pub(crate) fn next(&mut self, v: ValueRef) -> Result<Bytes> {
        if self.ready.is_empty() {
            self.read_chunk();
        }
        let (read_for, value) = self
            .ready
            .pop_front()
            .expect("asked for no more values than the walk holds");
        debug_assert_eq!(read_for, v, "values are asked for in the walk's order");
        value
    }

    fn read_chunk(&mut self) {
        let values_max = if self.is_parallel { CHUNK_VALUES } else { 1 };
        let mut chunk = Vec::new();
        let mut bytes = 0;
        while chunk.len() < values_max && bytes < CHUNK_BYTES {
            let Some(v) = self.refs.next() else { break };
            bytes += u64::from(v.len);
            chunk.push(v);
        }
        let read = self.read;
        let read_all = |refs: &[ValueRef]| refs.iter().map(|&v| (v, read(v))).collect::<Vec<_>>();
        let (front, back) = chunk.split_at(chunk.len() / 2);
        let back_read = (!front.is_empty()).then(|| {
            std::thread::scope(|scope| {
                let spawned = std::thread::Builder::new()
                    .name("idemkv-read-ahead".into())
                    .spawn_scoped(scope, || read_all(back));
                let front_read = read_all(front);
                // Without a thread the back half is read here too.
                let back_read = match spawned {
                    Ok(handle) => match handle.join() {
                        Ok(values) => values,
                        Err(panic) => std::panic::resume_unwind(panic),
                    },
                    Err(_) => read_all(back),
                };
                (front_read, back_read)
            })
        });
        match back_read {
            Some((front_read, back_read)) => {
                self.ready.extend(front_read);
                self.ready.extend(back_read);
            }
            None => self.ready.extend(read_all(&chunk)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::error::Error;

    /// A value of `len` bytes at `offset`.
    fn at(offset: u32, len: u32) -> ValueRef {
        ValueRef {
            segment: 1,
            offset,
            len,
            crc: None,
            fingerprint: None,
        }
    }

    /// A read that returns the offset as text, fails for offsets that are
    /// multiples of `fail_every`, and notes every offset it read.
    fn reader(fail_every: u32, log: &Mutex<Vec<u32>>) -> impl Fn(ValueRef) -> Result<Bytes> + Sync {
        move |v: ValueRef| {
            log.lock().unwrap().push(v.offset);
            if v.offset.is_multiple_of(fail_every) {
                Err(Error::Corruption {
                    segment: 1,
                    file: "1.seg".into(),
                    offset: u64::from(v.offset),
                    reason: "bad".into(),
                })
            } else {
                Ok(Bytes::from(v.offset.to_string()))
            }
        }
    }

    #[test]
    fn values_come_in_the_walk_s_order_across_chunks_with_their_own_errors() {
        // More values than a chunk holds, then values large enough that the
        // byte bound ends chunks, one of them alone.
        let refs: Vec<ValueRef> = (1..=CHUNK_VALUES as u32 * 2 + 7)
            .map(|i| at(i, 10))
            .chain((0..5).map(|i| at(100_000 + i, 3 << 20)))
            .chain([at(200_001, 9 << 20)])
            .collect();
        for is_parallel in [false, true] {
            let log = Mutex::new(Vec::new());
            let read = reader(1000, &log);
            let mut values = ReadAhead::new(refs.iter().copied(), &read, is_parallel);
            for &v in &refs {
                match values.next(v) {
                    Ok(bytes) => assert_eq!(bytes, v.offset.to_string(), "{is_parallel}"),
                    Err(e) => {
                        assert!(v.offset.is_multiple_of(1000), "{is_parallel}: {e}");
                        assert!(e.to_string().contains(&v.offset.to_string()), "{e}");
                    }
                }
            }
            drop(values);
            let mut read_offsets = log.lock().unwrap().clone();
            read_offsets.sort_unstable();
            let mut expected: Vec<u32> = refs.iter().map(|v| v.offset).collect();
            expected.sort_unstable();
            assert_eq!(read_offsets, expected, "each value read once");
        }
    }

    #[test]
    fn without_a_second_thread_each_value_is_read_when_asked_for() {
        // The fault tests' storage sees the reads interleaved with the
        // writes as they were before reading ahead: one read per value
        // asked for, in order.
        let refs: Vec<ValueRef> = (1..=50).map(|i| at(i, 10)).collect();
        let log = Mutex::new(Vec::new());
        let read = reader(u32::MAX, &log);
        let mut values = ReadAhead::new(refs.iter().copied(), &read, false);
        for (asked, &v) in refs.iter().enumerate() {
            values.next(v).unwrap();
            let read_offsets = log.lock().unwrap().clone();
            let expected: Vec<u32> = refs[..=asked].iter().map(|v| v.offset).collect();
            assert_eq!(read_offsets, expected);
        }
    }
}
