#!/usr/bin/env bash
# Our VMM and Firecracker (and Cloud Hypervisor) side by side on this host
# (tests/src/bin/firecracker-compare/): driven through their APIs, booting the test guest's
# image, which boots itself through its PVH entry under each; rows interleaved, one table per
# VMM compared.
#
# Usage: tests/firecracker-compare/run.sh FIRECRACKER [--cloud-hypervisor CH] [--runs N]
#                                         [--sizes GIB,...] [--dir DIR] [--populate lazy|eager]
#   FIRECRACKER  the firecracker binary to measure against
#   --cloud-hypervisor  a cloud-hypervisor binary for the boot rows (its snapshot fails on PVM)
#   --dir        where the memory files go (default: the temp directory): our VM's zone and
#                Firecracker's Full snapshot memory file, on the same file system
#   --populate   our VM's population (default lazy, as Firecracker's memory)
#
# How the Firecracker of BENCHMARKS.md was built (never committed here): its public source at
# tag v1.16.1 (the one binary file its tests need, which the snapshot we had lacked, left out),
# the micro-http crate it takes from git at commit 876f3fe as a path dependency through
# `[patch."https://github.com/firecracker-microvm/micro-http"]` in its .cargo/config.toml (its
# own build settings kept: codegen-units=1), its rust-toolchain.toml removed (it pins 1.95.0
# with musl targets; this host has stable 1.95 for the gnu target), `apt-get install
# libclang-dev libseccomp-dev`, then `cargo build --release -p firecracker`. On the gnu target
# Firecracker has no default seccomp policy and installs resources/seccomp/unimplemented.json,
# which allows every system call (its build says so).
#
# How the Cloud Hypervisor of BENCHMARKS.md was built (never committed here): its public source
# at tag v53.0, the micro-http crate it takes from git at the commit its Cargo.lock names
# (5c2254d) as a path dependency through `[patch."https://github.com/firecracker-microvm/micro-http"]`
# appended to its Cargo.toml, then `cargo build --release --bin cloud-hypervisor`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIRECRACKER=${1:?usage: run.sh FIRECRACKER [--cloud-hypervisor CH] [--runs N] [--sizes GIB,...] [--dir DIR] [--populate MODE]}
shift
cd "$ROOT"
cargo build --release -q -p vmm-cli -p e2e-tests --bin vmm --bin firecracker-compare
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
echo "this tree: $(git log --oneline -1)$(git diff --quiet || echo ' (with uncommitted changes)')"
exec target/release/firecracker-compare --firecracker "$FIRECRACKER" "$@"
