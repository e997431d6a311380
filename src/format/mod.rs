//! Byte layouts only: no files, no state. The `FORMAT` section of DESIGN.md
//! is the source of truth; each codec here names its subsection.
//!
//! All fixed-width integers are little-endian. Variable-length integers are
//! unsigned LEB128 ("varint"), at most 10 bytes.

pub(crate) mod codec;
pub(crate) mod record;
pub(crate) mod segment;
pub(crate) mod state;

/// Format version written in every segment header.
///
/// Version 1 was never released and changed in place (its early builds had
/// 24-byte frames without `synced_to`); its segments are refused rather
/// than misread as torn.
pub(crate) const FORMAT_VERSION: u32 = 2;

/// Longest event id, key, batch id or checkpoint source, in bytes.
pub(crate) const ID_BYTES_MAX: usize = 4096;

/// Longest checkpoint position, in bytes.
pub(crate) const POSITION_BYTES_MAX: usize = 64 * 1024;

/// Largest record body. Keeps every offset inside a segment within `u32`.
pub(crate) const RECORD_BODY_BYTES_MAX: usize = 1 << 30;
