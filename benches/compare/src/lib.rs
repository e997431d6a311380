//! The comparison's engines, workloads and harness, shared by its two
//! binaries: `idemkv-compare` (everything but RocksDB) and
//! `idemkv-compare-rocksdb` (the same, plus RocksDB; feature `rocksdb`).

mod cli;
pub mod engines;
pub mod run;
pub mod selftest;
pub mod semantics;
pub mod workload;

pub use cli::main;
