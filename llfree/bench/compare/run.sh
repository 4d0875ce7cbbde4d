#!/usr/bin/env bash
# Compares this tree's LLFree with the one of git revision BASE on the llfree-bench harness
# (bulk, rand, repeat at orders 0 and 9 on 1 and 2 threads), rounds interleaved, and prints
# each cell's medians and the speed-up (base time / this tree's time).
#
# Usage: llfree/bench/compare/run.sh BASE [--rounds N] [--zone SIZE] [--iterations N]
# The base is checked out as a git worktree in target/llfree-compare/base.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${1:?usage: run.sh BASE [--rounds N] [--zone SIZE] [--iterations N]}
shift
# shellcheck source=base.sh
. "$HERE/base.sh" "$BASE"
echo "base: $(git -C "$WORK/base" log --oneline -1); this tree: $(git -C "$ROOT" log --oneline -1)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)')"
cargo run --release -q --manifest-path "$HERE/Cargo.toml" --target-dir "$WORK/target" -- "$@"
