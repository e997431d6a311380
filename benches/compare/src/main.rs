//! `idemkv-compare`: every engine but RocksDB, whose runs it hands to
//! `idemkv-compare-rocksdb` when that binary is built beside it.

fn main() {
    idemkv_compare::main();
}
