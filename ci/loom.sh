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
# Measured on a 2-core machine shared with other builds (load 4 to 5), with
# the 14 models of tests/loom.rs at LOOM_MAX_PREEMPTIONS=3: 33 s in the
# models; the first build of the loom tree (release, own target dir) took
# 2 min 44 s, so a cold run of this script takes about 3.5 minutes. Each
# step up of LOOM_MAX_PREEMPTIONS multiplies the time in the models (a
# three-thread model that took 510 s at 3 was shrunk to two threads).
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

echo "loom: LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS}, target ${CARGO_TARGET_DIR}"
# No default features: tokio (the waiting timer) does not build under
# `--cfg loom`, and the models do not wait.
cargo test --release --no-default-features --test loom -- --test-threads=1 "$@"
# Models of protocols inside the crate that the public API does not reach
# (the warm-up controller's once-per-window sync, the compact window's
# admission and rotation): unit tests named `loom_models`.
cargo test --release --no-default-features --lib loom_models -- --test-threads=1
