#!/usr/bin/env bash
# The current layer beside the layer of another commit, in one process:
#
#   perf/load/paired-base/run.sh [BASE_REV] [ROUNDS]
#
# Extracts BASE_REV (default: the merge base with main, else HEAD~1) into
# target/paired-base/src, renames its version so that Cargo can hold both
# copies of the crate, writes a manifest outside the workspace that depends
# on the working tree and on that copy, and runs main.rs (next to this
# script) in release mode. Everything it writes stays under
# target/paired-base.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
rev=${1:-$(git -C "$root" merge-base HEAD main 2>/dev/null || git -C "$root" rev-parse HEAD~1)}
rounds=${2:-40000}
label=$(git -C "$root" rev-parse --short "$rev")
work="$root/target/paired-base"
src="$work/src"
bench="$work/bench"

rm -rf "$src"
mkdir -p "$src" "$bench"
git -C "$root" archive "$rev" | tar -x -C "$src"
# Two path packages of one name and version cannot share a lock file.
sed -i '0,/^version = "\(.*\)"$/s//version = "\1-base"/' "$src/Cargo.toml"

cat >"$bench/Cargo.toml" <<MANIFEST
[package]
name = "paired-base"
version = "0.0.0"
edition = "2021"
publish = false

# Its own workspace: not a member of the crate's.
[workspace]

[[bin]]
name = "paired-base"
path = "$root/perf/load/paired-base/main.rs"

[dependencies]
tower-sliding-window = { path = "$root" }
base = { package = "tower-sliding-window", path = "$src" }
tokio = { version = "1", features = ["rt", "macros"] }
axum = "0.8"
tower = { version = "0.5", features = ["util"] }
tower_governor = "0.8"
http-body-util = "0.1"
MANIFEST
# The versions the workspace builds with.
cp "$root/Cargo.lock" "$bench/Cargo.lock"

CARGO_TARGET_DIR="$work/target" cargo run --release --quiet \
    --manifest-path "$bench/Cargo.toml" -- "$rounds" "$label"
