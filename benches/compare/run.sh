#!/usr/bin/env bash
# Runs the peer comparison from the repository root. `--rocksdb` first installs
# clang and libclang (needed to build RocksDB) and enables the `rocksdb` feature.
# Any other arguments go to the program, e.g. `benches/compare/run.sh --rocksdb --all --quick`.
set -euo pipefail
cd "$(dirname "$0")/../.."
features=()
if [[ "${1:-}" == "--rocksdb" ]]; then
    shift
    if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1; then
        apt-get update
        apt-get install -y clang libclang-dev
    fi
    features=(--features rocksdb)
fi
exec cargo run --release "${features[@]}" --manifest-path benches/compare/Cargo.toml -- "$@"
