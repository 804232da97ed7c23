#!/usr/bin/env bash
# Model-check the statistics core with loom (tests/loom.rs).
#
# `--cfg loom` swaps every atomic of the crate for loom's (see src/sync.rs),
# and loom then explores the interleavings of each model in tests/loom.rs.
# The build goes to its own target directory: the cfg reaches every crate,
# so sharing target/ would rebuild the normal tree on every switch.
#
# LOOM_MAX_PREEMPTIONS bounds how often a model's threads may be preempted
# while they could have gone on. The races the models exist for need a
# thread stopped between a load and the compare-and-swap or store that
# depends on it while another thread runs: both bugs these models have found
# (a stale cached sum written back over a newer bucket's, and an admission
# swapped into a bucket in the middle of its reset) show up with 2. We run
# with 3 for a margin of one more preemption; each step up multiplies the
# explored executions (4 costs about five times 3).
#
# Measured on a 2-core machine shared with other builds (load 6), time spent
# in the models:
#   LOOM_MAX_PREEMPTIONS=2    2.4 s   (3 s at a heavier load)
#   LOOM_MAX_PREEMPTIONS=3    5.1 s   (17 s at a heavier load)   <- default
#   LOOM_MAX_PREEMPTIONS=4   27 s     (66 s at a heavier load)
# The first build of the loom tree (release, own target dir) took 82 s, so
# a cold run of this script takes about 1.5 minutes, 2 at most.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

echo "loom: LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS}, target ${CARGO_TARGET_DIR}"
cargo test --release --test loom -- --test-threads=1 "$@"
