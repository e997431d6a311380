//! `idemkv-compare-rocksdb`: the comparison with RocksDB linked in. The
//! `idemkv-compare` binary beside it runs RocksDB's jobs (and the semantics
//! check, when RocksDB is among the engines) through this one, so that no
//! other engine's process loads RocksDB's library.

mod rocksdb_peer;

fn main() {
    idemkv_compare::engines::provide_rocksdb(|dir, mode| Box::new(rocksdb_peer::RocksdbPeer::open(dir, mode)));
    idemkv_compare::main();
}
