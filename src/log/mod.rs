//! The segmented write-ahead log: file names, appending with rotation,
//! reading records back (telling a torn tail from corruption), and the
//! memory maps that values are read through.

pub(crate) mod names;
pub(crate) mod reader;
pub(crate) mod segments;
pub(crate) mod sync_gate;
pub(crate) mod writer;
pub(crate) mod zero_fill;
