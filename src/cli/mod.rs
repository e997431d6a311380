//! Command line (skeleton, being written).
