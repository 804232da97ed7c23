#!/usr/bin/env bash
# The paired layer bench in several code and heap layouts, and what our
# compact contenders cost against tower_governor's over all of them:
#
#   perf/layouts.sh [SEEDS] [ROUNDS] [BASE_REV]
#
# The bench's figures move by 0.1x to 0.3x from one build to the next with
# where the linker puts each function (a request through axum runs from
# about as many code lines as a core's instruction cache holds: see
# "2026-11-29, night" in docs/performance.md), and with where the heap
# puts each contender's state. One build and one run are one draw of both.
# This script links the bench crate once as built and once per seed with
# its functions in a random order (lld's `--shuffle-sections`, every
# `.text.*` section, the seed given), runs `layer_paired` ROUNDS times
# (default 1) in each binary, binaries taken in turn, a seed's runs with
# the heap padded from the same seed (`LAYER_PAIRED_HEAP_SEED`, see
# `perf/benches/layer/paired.rs`), and prints per run the two ratios the
# compact tier's target is about, then their medians over all runs.
#
# With BASE_REV, the bench of that revision is built the same way (from
# `git archive`, in its own target directory: a full build), and each
# layout's runs of the two builds alternate, in an order drawn per
# layout; the summary is printed for each. A revision older than the heap
# padding ignores `LAYER_PAIRED_HEAP_SEED`: its runs then vary the code's
# layout only.
#
# SEEDS defaults to "1 2 3 4 5 6 7 8 9 10 11 12". Needs lld as the linker:
# the default of Rust 1.90 and later on x86_64 Linux (with an older
# toolchain, add `-C link-arg=-fuse-ld=lld` to `extra` below, lld
# installed), and jq. Each seed recompiles the bench crate alone (tens of
# seconds); each run takes about a minute. Everything it writes stays
# under target/layouts. Nothing else should run meanwhile.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
# shellcheck source=perf/layouts-lib.sh
. "$root/perf/layouts-lib.sh"
seeds=${1:-"1 2 3 4 5 6 7 8 9 10 11 12"}
rounds=${2:-1}
base_rev=${3:-}
out="$root/target/layouts"
mkdir -p "$out"

# The seeds split where they have spaces.
# shellcheck disable=SC2206
layouts=(as-built $seeds)

# The bench of TREE in every layout, as $out/LABEL-LAYOUT.
build() {
    link_layouts "$1" "$2" "$out/$3" main --profile bench -p perf --bench main
}

build_all "$base_rev"

for round in $(seq "$rounds"); do
    for layout in "${layouts[@]}"; do
        heap=()
        if [ "$layout" != as-built ]; then
            heap=(env "LAYER_PAIRED_HEAP_SEED=$layout")
        fi
        order=("${labels[@]}")
        if [ "${#labels[@]}" -eq 2 ] && [ $((RANDOM % 2)) -eq 1 ]; then
            order=("${labels[1]}" "${labels[0]}")
        fi
        for label in "${order[@]}"; do
            echo "round $round, layout $layout, $label" >&2
            "${heap[@]}" "$out/$label-$layout" --bench layer_paired --noplot \
                >"$out/run-$label-$round-$layout.txt" 2>&1
        done
    done
done

# Per run, each contender's median ns beyond the no-op layer (the third
# column of the bench's table), and the ratios of ours to tower_governor's
# with the same key; then the medians over the runs.
for label in "${labels[@]}"; do
    echo
    echo "$label"
    for round in $(seq "$rounds"); do
        for layout in "${layouts[@]}"; do
            awk -v run="$round/$layout" '
                NF == 5 && $4 ~ /^\[/ { beyond[$1] = $3 }
                END {
                    h = beyond["ours_compact_header"] / beyond["tower_governor_header"]
                    p = beyond["ours_compact_peer_ip"] / beyond["tower_governor_peer_ip"]
                    printf "%s %.3f %.3f %.1f %.1f %.1f %.1f\n", run, h, p,
                        beyond["ours_compact_header"], beyond["tower_governor_header"],
                        beyond["ours_compact_peer_ip"], beyond["tower_governor_peer_ip"]
                }' "$out/run-$label-$round-$layout.txt"
        done
    done >"$out/summary-$label.txt"

    awk "$awk_median"'
        BEGIN {
            print "run (round/layout)   header  address   ns beyond no-op: ours, tower_governor (header; address)"
        }
        {
            n++
            h[n] = $2; p[n] = $3
            oh[n] = $4; gh[n] = $5; op[n] = $6; gp[n] = $7
            if ($2 <= 1) h_met++
            if ($3 <= 1) p_met++
            printf "%-20s %6.2fx %7.2fx   %6.1f %6.1f; %6.1f %6.1f\n", $1, $2, $3, $4, $5, $6, $7
        }
        END {
            printf "median of %d runs:   %6.2fx %7.2fx   %6.1f %6.1f; %6.1f %6.1f\n", n,
                median(h, n), median(p, n), median(oh, n), median(gh, n), median(op, n), median(gp, n)
            printf "runs at or under 1.0x: header %d of %d, address %d of %d\n", h_met + 0, n, p_met + 0, n
        }' "$out/summary-$label.txt"
done
