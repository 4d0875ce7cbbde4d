#!/usr/bin/env bash
# Instructions per get and per put (order 0 and 9, one core) of this tree's LLFree and of
# revision BASE's, under valgrind's callgrind: the difference of runs with N and 2N gets (and
# with 2N gets and N puts), so that set-up costs cancel.
#
# Usage: llfree/bench/compare/count.sh BASE [N]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${1:?usage: count.sh BASE [N]}
N=${2:-100000}
# shellcheck source=base.sh
. "$HERE/base.sh" "$BASE"
cargo build --release -q --manifest-path "$HERE/Cargo.toml" --target-dir "$WORK/target"
BIN=$WORK/target/release/llfree-compare
instructions() {
    valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" "$BIN" count "$@" \
        >/dev/null 2>&1
    callgrind_annotate "$WORK/callgrind.out" 2>/dev/null |
        awk '/PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 } END { print total }'
}
echo "| side | order | instructions per get | per put |"
echo "|---|---|---|---|"
for side in base new; do
    for order in 0 9; do
        n=$N
        [ "$order" = 9 ] && n=$((N / 512 > 200 ? N / 512 : 200))
        one=$(instructions "$side" "$order" "$n" 0)
        two=$(instructions "$side" "$order" "$((2 * n))" 0)
        put=$(instructions "$side" "$order" "$((2 * n))" "$n")
        echo "| $side | $order | $(((two - one) / n)) | $(((put - two) / n)) |"
    done
done
