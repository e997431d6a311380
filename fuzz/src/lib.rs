//! Fuzz targets of idemkv, and what they share: the input layouts, the
//! reference model, and valid stores built by the real engine for seeds.
//!
//! Each target in `fuzz_targets/` is one line calling `run` of the module of
//! the same name, so that a crash input can also be replayed from a plain
//! test (`cargo test --manifest-path fuzz/Cargo.toml`).

pub mod apply_model;
pub mod decode_record;
pub mod image;
pub mod layout;
pub mod ndjson_line;
pub mod open_store;
pub mod seeds;
