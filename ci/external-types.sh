#!/usr/bin/env bash
# Fails when the public API of tower-sliding-window names an item of a crate
# that is not listed in ci/external-types.txt.
#
# The same check as `cargo check-external-types` (which needs a pinned
# nightly), read off the rendered docs instead: rustdoc writes every
# external type in a public signature as a link into that crate's docs
# (`../../<crate>/...` for dependencies, doc.rust-lang.org for std, docs.rs
# for crates that set their own root URL). The script builds the docs with
# every feature, keeps only the signatures of each page (item declarations,
# the headers of methods and trait implementations, re-exports), drops the
# "Blanket Implementations" section (impls that other crates provide for
# every type, such as tracing's `Instrument`), and lists the crates those
# links point into. Prose links in doc comments are not API and are not
# read.
#
# Needs only bash, grep, sed, awk and sort.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed_file=ci/external-types.txt
crate=tower_sliding_window
# Its own target directory: the doc output below depends on the empty
# directories made before it, which a shared target/doc may not have had.
export CARGO_TARGET_DIR=target/external-types
doc_dir="$CARGO_TARGET_DIR/doc"

# rustdoc links an external type only if it knows where that crate's docs
# are: a docs.rs root the crate declares, or a directory of that name beside
# ours. Documenting every dependency would take minutes; an empty directory
# per dependency is enough for rustdoc to write the relative links we read.
mkdir -p "$doc_dir"
for dep in $(cargo tree -e normal --prefix none --format '{lib}' --all-features \
    -p tower-sliding-window | sed 's/ (\*)$//' | sort -u); do
    [[ $dep == "$crate" ]] || mkdir -p "$doc_dir/$dep"
done
cargo doc --no-deps --all-features --lib --quiet

mapfile -t allowed < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$allowed_file" | grep -v '^$')
[[ ${#allowed[@]} -gt 0 ]] || { echo "external types: $allowed_file lists nothing" >&2; exit 2; }

# Prints "<crate> <page>" for every external crate a signature on <page>
# links to.
scan_page() {
    local page=$1 rel depth
    rel=${page#"$doc_dir"/}
    # Directory depth below the doc root: tower_sliding_window/clock/x.html -> 2.
    depth=$(tr -cd '/' <<<"$rel" | wc -c)
    local html
    html=$(<"$page")
    # Everything from the blanket implementations on is other crates' impls.
    html=${html%%id=\"blanket-implementations\"*}
    # One element per line, then keep the signature elements only.
    sed -e 's/<\(h3\|h4\|pre\|div\|section\|details\|summary\|li\|dt\|dd\)[ >]/\n&/g' \
        -e 's#</\(h3\|h4\|pre\)>#&\n#g' <<<"$html" |
        awk '
            /^<pre class="rust item-decl"/ { keep = 1 }
            /^<h[34] class="code-header"/  { keep = 1 }
            /^<div class="item-name"><code>pub use / { keep = 1 }
            keep { print }
            /<\/pre>|<\/h[34]>|<\/code>/ { keep = 0 }
        ' |
        grep -o 'href="[^"]*"' | sed -e 's/^href="//' -e 's/"$//' |
        while read -r href; do
            local target=""
            case $href in
                https://doc.rust-lang.org/*)
                    # https://doc.rust-lang.org/<channel>/<crate>/...
                    target=$(cut -d/ -f5 <<<"$href") ;;
                https://docs.rs/*)
                    # https://docs.rs/<package>/<version>/<crate>/...
                    target=$(cut -d/ -f6 <<<"$href") ;;
                http://* | https://* | '#'*) ;;
                *)
                    # Relative: as many `../` as the page is deep leave the
                    # doc root; the next component is a crate.
                    local ups
                    ups=$(grep -o '\.\./' <<<"$href" | wc -l || true)
                    if [[ $ups -ge $depth ]]; then
                        target=$(sed -e 's#^\(\.\./\)*##' <<<"$href" | cut -d/ -f1)
                    fi ;;
            esac
            case $target in
                "" | "$crate" | src | static.files | *.html | *.js) ;;
                *) echo "$target $rel" ;;
            esac
        done
}

found=$(
    find "$doc_dir/$crate" -name '*.html' -print0 |
        while IFS= read -r -d '' page; do scan_page "$page"; done |
        sort -u
)

status=0
echo "external crates in the public API:"
for ext in $(cut -d' ' -f1 <<<"$found" | sort -u); do
    if printf '%s\n' "${allowed[@]}" | grep -qx "$ext"; then
        echo "  $ext (allowed)"
    else
        echo "  $ext NOT ALLOWED, named by:" >&2
        grep "^$ext " <<<"$found" | cut -d' ' -f2 | sed 's/^/    /' >&2
        status=1
    fi
done
if [[ $status -ne 0 ]]; then
    echo "external types: the public API names crates not in $allowed_file;" \
        "hide the type, or add the crate there with the reason" >&2
fi
exit $status
