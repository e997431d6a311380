//! Primitive encoders and a bounds-checked decoder (DESIGN.md, FORMAT, "Encoding").
//!
//! The decoder never panics and never allocates from a length it read: every
//! length is checked against the bytes that remain before it is used.

/// Why a body failed to decode, with the offset inside the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError {
    pub offset: usize,
    pub what: &'static str,
}

pub(crate) fn put_u8(buf: &mut Vec<u8>, v: u8) {
    buf.push(v);
}

pub(crate) fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u128(buf: &mut Vec<u8>, v: u128) {
    buf.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// A varint length followed by the bytes.
pub(crate) fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// A value as records carry it: varint length, CRC32 of the bytes, the bytes.
/// The CRC lets a read of the value alone, long after the record was
/// checked, verify it.
pub(crate) fn put_value(buf: &mut Vec<u8>, value: &[u8]) {
    put_value_with_crc(buf, value, crc32fast::hash(value));
}

/// `put_value` of a value whose CRC-32 is known to be `crc`.
pub(crate) fn put_value_with_crc(buf: &mut Vec<u8>, value: &[u8], crc: u32) {
    debug_assert_eq!(crc, crc32fast::hash(value), "the value's own CRC");
    put_varint(buf, value.len() as u64);
    put_u32(buf, crc);
    buf.extend_from_slice(value);
}

/// Reads primitives from a byte slice, tracking the offset.
#[derive(Debug)]
pub(crate) struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Whether `value` checks each value's CRC.
    checks_values: bool,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            checks_values: true,
        }
    }

    /// A decoder for bytes this process encoded, whose value CRCs were
    /// computed from the very bytes they follow: the structure is checked
    /// as by `new`, the values' CRCs are not computed again.
    pub(crate) fn of_own_encoding(buf: &'a [u8]) -> Self {
        Self {
            checks_values: false,
            ..Self::new(buf)
        }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn err(&self, what: &'static str) -> DecodeError {
        self.err_at(self.pos, what)
    }

    /// An error at `offset`, where a field read already began: a tag or a
    /// length is refused at its own byte, not at the one after it.
    pub(crate) fn err_at(&self, offset: usize, what: &'static str) -> DecodeError {
        DecodeError { offset, what }
    }

    pub(crate) fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| self.err(what))?;
        let out = self.buf.get(self.pos..end).ok_or_else(|| self.err(what))?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, what)?;
        bytes.try_into().map_err(|_| self.err(what))
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u128(&mut self, what: &'static str) -> Result<u128, DecodeError> {
        Ok(u128::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.u8(what)?;
            let part = u64::from(byte & 0x7f);
            if shift == 63 && part > 1 {
                self.pos = start;
                return Err(self.err(what));
            }
            value |= part << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        self.pos = start;
        Err(self.err(what))
    }

    /// A varint that must fit in `usize` and be at most `max`.
    pub(crate) fn len(&mut self, max: usize, what: &'static str) -> Result<usize, DecodeError> {
        let v = self.varint(what)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= max)
            .ok_or_else(|| self.err(what))
    }

    /// A count of entries each at least `entry_bytes_min` long: bounded by what remains,
    /// so that no caller preallocates from a forged count.
    pub(crate) fn count(
        &mut self,
        entry_bytes_min: usize,
        what: &'static str,
    ) -> Result<usize, DecodeError> {
        let max = self.remaining() / entry_bytes_min.max(1);
        self.len(max, what)
    }

    /// A varint length (at most `max`) followed by that many bytes.
    pub(crate) fn bytes(
        &mut self,
        max: usize,
        what: &'static str,
    ) -> Result<&'a [u8], DecodeError> {
        let len = self.len(max, what)?;
        self.take(len, what)
    }

    /// A value written by `put_value`, checked (see `of_own_encoding`);
    /// returns it, its offset and its CRC.
    pub(crate) fn value(&mut self, max: usize) -> Result<(&'a [u8], usize, u32), DecodeError> {
        let len = self.len(max, "value length")?;
        let crc = self.u32("value checksum")?;
        let at = self.position();
        let value = self.take(len, "value")?;
        if self.checks_values && crc32fast::hash(value) != crc {
            return Err(DecodeError {
                offset: at,
                what: "value checksum mismatch",
            });
        }
        Ok((value, at, crc))
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(self.err("trailing bytes after record body"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trips_edges() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            let mut d = Decoder::new(&buf);
            assert_eq!(d.varint("v").unwrap(), v);
            assert_eq!(d.remaining(), 0);
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let buf = [0xff; 11];
        assert!(Decoder::new(&buf).varint("v").is_err());
        let buf = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(Decoder::new(&buf).varint("v").is_err());
    }

    #[test]
    fn forged_count_is_bounded_by_remaining_bytes() {
        let mut buf = Vec::new();
        put_varint(&mut buf, 1_000_000);
        buf.extend_from_slice(&[0; 10]);
        assert!(Decoder::new(&buf).count(1, "n").is_err());
    }
}
