# Shared by perf/layouts.sh and perf/cachesim.sh (sourced, not run): a
# target of the perf crate linked in several code layouts, and a
# revision's files to build it from.

# link_layouts TREE TARGET_DIR DEST NAME CARGO_ARGS...: links the target
# NAME of TREE (CARGO_ARGS select it: package, profile, target, features)
# once as built and once per seed of the caller's `layouts` array (entries
# `as-built` or a seed), every `.text.*` section in a random order for a
# seed (lld's `--shuffle-sections`), as DEST-LAYOUT. The extra link
# argument goes to that target alone, so the libraries it links are the
# same objects in every layout.
link_layouts() {
    local tree=$1 target=$2 dest=$3 name=$4 layout exe
    shift 4
    for layout in "${layouts[@]}"; do
        local extra=()
        if [ "$layout" != as-built ]; then
            extra=(-C "link-arg=-Wl,--shuffle-sections=.text.*=$layout")
        fi
        exe=$(cd "$tree" && CARGO_TARGET_DIR="$target" cargo rustc --quiet "$@" \
            --message-format=json -- "${extra[@]}" |
            jq -r --arg name "$name" 'select(.reason == "compiler-artifact" and .target.name == $name and .executable != null) | .executable')
        cp "$exe" "$dest-$layout"
    done
}

# archive_tree ROOT REV DIR: the files of revision REV of the repository at
# ROOT (from `git archive`), in DIR, emptied first.
archive_tree() {
    rm -rf "$3"
    mkdir -p "$3"
    git -C "$1" archive "$2" | tar -x -C "$3"
}

# build_all BASE_REV: the caller's `build TREE TARGET_DIR LABEL` for the
# tree at `$root` (label `current`) and, with BASE_REV, for that
# revision's files, in `$out/base-src` with its own target directory
# (label `base-` and the short hash), after the caller's `prepare_base
# SRC` if it defines one; sets `labels` to the labels built.
build_all() {
    labels=(current)
    build "$root" "${CARGO_TARGET_DIR:-$root/target}" current
    if [ -n "$1" ]; then
        local label src="$out/base-src"
        label=$(git -C "$root" rev-parse --short "$1")
        archive_tree "$root" "$1" "$src"
        if declare -F prepare_base >/dev/null; then
            prepare_base "$src"
        fi
        build "$src" "$out/base-target" "base-$label"
        labels+=("base-$label")
    fi
}

# An awk function, `median(values, n)`: the median of `values[1..n]`, for
# the summaries (`awk "$awk_median"'...'`).
# shellcheck disable=SC2034
awk_median='
    function median(values, n,    sorted, i, j, t) {
        for (i = 1; i <= n; i++) sorted[i] = values[i]
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && sorted[j - 1] > sorted[j]; j--) {
                t = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = t
            }
        return n % 2 ? sorted[(n + 1) / 2] : (sorted[n / 2] + sorted[n / 2 + 1]) / 2
    }
'
