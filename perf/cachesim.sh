#!/usr/bin/env bash
# What one request through axum costs each per-client layer in the
# instruction cache and the branch predictors, simulated, over several code
# layouts:
#
#   perf/cachesim.sh [SEEDS] [BASE_REV]
#
# A request through axum runs from about as many 64-byte lines of code as
# a core's level-1 instruction cache holds, so the cache is refilled on
# every request, and how much of that a layer adds depends on where the
# linker put its functions and everyone else's. This machine has no
# hardware counters to read; callgrind's simulation of its caches
# (`--cache-sim=yes`: level 1 as the processor reports it, 32 KiB, 8 ways,
# for instructions) and of a branch predictor (`--branch-sim=yes`) takes
# their place. The same simulator over several layouts gives a figure that
# does not move with the load of the machine, which the paired bench's
# times do.
#
# `perf/counts/layer.rs` is linked once as built and once per seed with
# every `.text.*` section in a random order (lld's `--shuffle-sections`,
# as `perf/layouts.sh` links the bench), and run under callgrind with its
# requests in rounds of 32 to each contender in turn
# (`COUNTS_LAYER_ROUND=32`, as `layer_paired` sends them), once per
# contender with collection on for that contender's function alone. Per
# layout it prints, beyond the no-op layer sent the same request
# (`noop_peer_ip`, `noop`), the instructions, the simulated level-1
# instruction misses and the mispredicted branches (conditional and
# indirect) of one request, for our compact layer and tower_governor's,
# by address and by header; then the medians over the layouts.
#
# With BASE_REV, that revision's library is measured the same way, with
# the current tree's `perf/counts/layer.rs` (so that both send the same
# requests in the same rounds), built from `git archive` in its own
# target directory.
#
# SEEDS defaults to "1 2 3 4 5 6 7". Needs valgrind, jq and lld (see
# `perf/layouts.sh`). Each layout relinks the driver (tens of seconds);
# each contender's run takes about 20 s, two at a time.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=perf/layouts-lib.sh
. "$root/perf/layouts-lib.sh"
seeds=${1:-"1 2 3 4 5 6 7"}
base_rev=${2:-}
out="$root/target/cachesim"
mkdir -p "$out"

# The seeds split where they have spaces.
# shellcheck disable=SC2206
layouts=(as-built $seeds)
contenders=(noop_peer_ip ours_compact_peer_ip tower_governor_peer_ip
    noop ours_compact_header tower_governor_header)

# The driver of TREE in every layout, as $out/LABEL-LAYOUT.
build() {
    link_layouts "$1" "$2" "$out/$3" counts-layer --release -p perf --bin counts-layer --features axum
}

# The base sends the current tree's requests, in the same rounds.
prepare_base() {
    cp "$root/perf/counts/layer.rs" "$1/perf/counts/layer.rs"
}

build_all "$base_rev"

# Every run, two at a time: LABEL LAYOUT CONTENDER per line.
for label in "${labels[@]}"; do
    for layout in "${layouts[@]}"; do
        for contender in "${contenders[@]}"; do
            echo "$label $layout $contender"
        done
    done
done | OUT="$out" xargs -P 2 -L 1 sh -c '
    COUNTS_LAYER_ROUND=32 valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes \
        --toggle-collect="counts_layer::$3" --callgrind-out-file="$OUT/$1-$2.$3.out" \
        "$OUT/$1-$2" >"$OUT/$1-$2.$3.log" 2>&1 || { echo "callgrind failed: $OUT/$1-$2.$3.log" >&2; exit 255; }
' run

# Per request: each contender serves 20 000 (`REQUESTS` of
# `perf/counts/layer.rs`, whatever the round, which must divide it).
for label in "${labels[@]}"; do
    echo
    echo "$label: per request beyond the no-op layer (instructions, simulated L1i misses, mispredicted branches)"
    for layout in "${layouts[@]}"; do
        printf '%s' "$layout"
        for contender in "${contenders[@]}"; do
            # callgrind's totals line: Ir ... I1mr (4th) ... Bcm (11th) Bim (13th).
            awk '/^(summary|totals):/ { print $2, $5, $12 + $14; exit }' \
                "$out/$label-$layout.$contender.out" | tr '\n' ' ' | sed 's/^/ /'
        done
        echo
    done | awk -v requests=20000 "$awk_median"'
        BEGIN {
            print "           address: ours         tower_governor       header: ours          tower_governor"
            print "layout      instr  L1i  mispr   instr  L1i  mispr   instr  L1i  mispr   instr  L1i  mispr"
        }
        {
            n++
            # Fields: layout, then per contender Ir, I1mr, mispredicted.
            for (c = 0; c < 6; c++)
                for (e = 0; e < 3; e++)
                    v[c, e] = $(2 + 3 * c + e) / requests
            col = 0
            for (c = 1; c <= 5; c++) {
                if (c == 3) continue
                base = c < 3 ? 0 : 3
                for (e = 0; e < 3; e++) {
                    col++
                    d[col, n] = v[c, e] - v[base, e]
                }
            }
            printf "%-9s", $1
            for (k = 1; k <= 12; k++) printf (k % 3 == 1 ? "  %6.1f" : " %5.1f"), d[k, n]
            printf "\n"
        }
        END {
            printf "%-9s", "median"
            for (k = 1; k <= 12; k++) {
                for (i = 1; i <= n; i++) column[i] = d[k, i]
                printf (k % 3 == 1 ? "  %6.1f" : " %5.1f"), median(column, n)
            }
            printf "\n"
        }'
done
