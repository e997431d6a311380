#!/usr/bin/env bash
# Runs the peer comparison from the repository root. Any arguments after the
# options below go to the program, e.g. `benches/compare/run.sh --rocksdb --all --quick`.
#
#   --rocksdb         build RocksDB from source (bundled, long; installs clang and libclang)
#   --rocksdb-debian  link Debian's librocksdb (7.8; installs librocksdb-dev, clang, libclang)
set -euo pipefail
cd "$(dirname "$0")/../.."
features=()
need() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        apt-get update
        apt-get install -y "${missing[@]}"
    fi
}
case "${1:-}" in
    --rocksdb)
        shift
        need clang libclang-dev
        features=(--features rocksdb)
        ;;
    --rocksdb-debian)
        shift
        need clang libclang-dev librocksdb-dev
        export ROCKSDB_LIB_DIR=/usr/lib/x86_64-linux-gnu
        features=(--features rocksdb-debian)
        ;;
esac
# `cargo build`, not `cargo run`: with a RocksDB feature it also builds
# idemkv-compare-rocksdb, which runs RocksDB's jobs (see README.md).
cargo build --release "${features[@]}" --manifest-path benches/compare/Cargo.toml
exec benches/compare/target/release/idemkv-compare "$@"
