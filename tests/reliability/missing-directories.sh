#!/usr/bin/env bash
# PUT /snapshot/create with snapshot_path in a missing directory, 256 MiB written: status,
# time, and whether a memory file is left; then PUT /vsock with uds_path in a missing directory.
# The reliability figures of BENCHMARKS.md. Usage: missing-directories.sh VMM_BINARY SCRATCH_DIR
set -u
V=$1; D=$2; rm -rf $D; mkdir -p $D
$V run --memory 256M --workload write:all,checkpoint:1 --api-socket $D/api.sock >/dev/null 2>&1 &
until $V info --socket $D/api.sock 2>/dev/null | grep -q Paused; do sleep 0.2; done
start=$(date +%s.%N)
code=$(curl -s -o $D/answer -w '%{http_code}' --unix-socket $D/api.sock -X PUT http://localhost/snapshot/create \
  -d "{\"snapshot_path\":\"$D/missing/vm.snap\",\"mem_file_path\":\"$D/vm.mem\"}")
end=$(date +%s.%N)
echo "snapshot into a missing directory: $code in $(echo "($end - $start) * 1000" | bc | cut -d. -f1) ms; memory file left: $([ -e $D/vm.mem ] && echo yes || echo no)"
kill -9 %1; wait 2>/dev/null
$V --api-sock $D/fc.sock >/dev/null 2>&1 &
sleep 0.5
code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket $D/fc.sock -X PUT http://localhost/vsock \
  -d "{\"guest_cid\":3,\"uds_path\":\"$D/missing/v.sock\"}")
echo "PUT /vsock into a missing directory: $code"
kill -9 %1; wait 2>/dev/null
