#!/usr/bin/env bash
# Runs every LLFree benchmark that BENCHMARKS.md quotes and writes CSVs, summaries and the
# fragmentation plot to OUT (default: llfree/bench/results). Takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-llfree/bench/results}
mkdir -p "$OUT"
cargo build --release -p llfree-bench
B=target/release/llfree-bench
ALL=llfree,llfree-shared,llfree-vm,buddy,buddy-pcp,list-locked,list-cas,list-local
run() { # name, args...
    local name=$1; shift
    echo "== $name: llfree-bench $*" | tee "$OUT/$name.txt"
    "$B" "$@" >"$OUT/$name.csv" 2>>"$OUT/$name.txt"
    cat "$OUT/$name.txt"
}
run bulk-0 bulk --zone 8G --threads 1,2 --order 0 --iterations 5 --alloc "$ALL"
run bulk-9 bulk --zone 8G --threads 1,2 --order 9 --iterations 5 --alloc llfree,llfree-shared,llfree-vm,buddy,buddy-pcp
run bulk-orders bulk --zone 8G --threads 2 --order 1,2,3,4,5,6,7,8,10 --iterations 3 --alloc llfree,buddy
run rand-0 rand --zone 8G --threads 1,2 --order 0 --iterations 5 --alloc "$ALL"
run repeat-0 repeat --zone 8G --threads 1,2 --order 0 --iterations 5 --alloc "$ALL"
run repeat-9 repeat --zone 8G --threads 1,2 --order 9 --iterations 5 --alloc llfree,llfree-shared,llfree-vm,buddy,buddy-pcp
run frag frag --zone 8G --rounds 100 --threads 2 --svg "$OUT/frag.svg"
run recover recover --zone 8G,16G --runs 5
