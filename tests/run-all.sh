#!/usr/bin/env bash
# Runs every test of the workspace (README's test command), in release mode and to the end even
# when one fails, showing what each test printed; then lists the tests that could not run on
# this host, one line per SKIP with its reason (the test harness counts them as passed).
# Arguments go to the test binaries, e.g. a name filter. Exits with cargo's status.
set -uo pipefail
cd "$(dirname "$0")/.."

output=$(mktemp)
trap 'rm -f "$output"' EXIT
cargo test --workspace --release --no-fail-fast -- --show-output "$@" 2>&1 | tee "$output"
status=${PIPESTATUS[0]}

# A test prints "SKIP: <test>: <reason>"; --show-output may show a line twice.
skips=$(grep -o 'SKIP: .*' "$output" | awk '!seen[$0]++')
echo
if [ -z "$skips" ]; then
    echo "== every test ran: none skipped"
else
    echo "== $(printf '%s\n' "$skips" | wc -l) skipped, each with its reason:"
    printf '%s\n' "$skips"
fi
if [ "$status" -eq 0 ]; then
    echo "== all tests passed"
else
    echo "== some tests failed (cargo test exited with $status): see 'failures:' above"
fi
exit "$status"
