#!/usr/bin/env python3
"""Measures the headline figures of BENCHMARKS.md in one run on this machine and writes them
into it (between the `report:begin` and `report:end` markers), with the date, the host, its load
and the commit measured.

Every row sets ours beside a baseline or a peer measured in the same run, interleaved:
  * LLFree against the spin-locked buddy allocator and the buddy with Linux's per-CPU lists
    (`llfree-bench`, 8 GiB, orders 0 and 9, one and two threads);
  * our VMM against Firecracker (`firecracker-compare`: boot of the built-in guest's image,
    snapshot create and load of a guest with every page written, `--clones` VMs loaded at once
    from one snapshot with their memory use, ours from a copy and from a zone snapshot), where
    `--firecracker` names a Firecracker binary (tests/firecracker-compare/run.sh says how the one of the report was
    built); without it those rows say that they were not measured.

Usage: scripts/benchmark-report.py [--firecracker PATH] [--runs N] [--sizes GIB,...]
                                   [--clones N] [--iterations N] [--print]
  --print   prints the section instead of writing it into BENCHMARKS.md
Takes about 5 minutes on 2 cores with Firecracker at 1 GiB, once the release build is done.
"""

import argparse
import csv
import io
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "BENCHMARKS.md")
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
RELEASE = os.path.join(ROOT, "target", "release")


def run(args, **kwargs):
    """Runs `args` in the repository; its stdout, or an exit with its stderr on failure."""
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(args)} exited with {done.returncode}:\n{done.stderr}")
    return done.stdout


def host():
    """One line about the machine: CPUs, model, kernel, /dev/kvm's kind."""
    model = "unknown CPU"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    kvm = "hardware KVM" if (" vmx" in flags or " svm" in flags) else "PVM /dev/kvm (no VMX/SVM)"
    return f"{os.cpu_count()} CPUs, {model}, Linux {os.uname().release}, {kvm}"


def load():
    return open("/proc/loadavg").read().split()[0]


def allocator_rows(iterations):
    """LLFree beside the buddies: median ns per operation of `iterations`, one table row each."""
    bench = os.path.join(RELEASE, "llfree-bench")
    allocs = "llfree,buddy,buddy-pcp"
    rows = []
    for kind, orders in (("bulk", "0,9"), ("rand", "0")):
        out = run([bench, kind, "--zone", "8G", "--threads", "1,2", "--order", orders,
                   "--iterations", str(iterations), "--alloc", allocs])
        times = {}
        for record in csv.DictReader(io.StringIO(out)):
            key = (record["alloc"], int(record["order"]), int(record["threads"]))
            times.setdefault(key, {"get": [], "put": []})
            # rand times only its frees: its get column is empty.
            for op in ("get", "put"):
                if record[f"{op}_ns"]:
                    times[key][op].append(float(record[f"{op}_ns"]))
        for (alloc, order, threads), values in sorted(times.items()):
            if alloc == "llfree":
                continue
            ours = times[("llfree", order, threads)]
            for op in ("get", "put") if kind == "bulk" else ("put",):
                name = {"bulk": f"bulk {op}", "rand": "random-order free"}[kind]
                a, b = statistics.median(ours[op]), statistics.median(values[op])
                rows.append((f"{name}, order {order}, {threads} thread(s), ns/op",
                             f"{a:.1f}", f"{b:.1f}", alloc, a / b))
    return rows


def firecracker_rows(firecracker, runs, sizes, clones):
    """`firecracker-compare`'s rows: (name, ours, theirs, ratio), each name prefixed with its
    table's subject where the table has one (the clones')."""
    compare = os.path.join(RELEASE, "firecracker-compare")
    out = run([compare, "--firecracker", firecracker, "--runs", str(runs), "--sizes", sizes,
               "--dir", "/dev/shm", "--clones", str(clones), "--clone-mib", "128"])
    rows, subject = [], ""
    for line in out.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[1] == "llfree-vmm":
            subject = "" if cells[0].startswith("row") else cells[0] + ": "
            continue
        rows.append((subject + cells[0], cells[1], cells[2], cells[3]))
    return rows


def section(args):
    lines = [
        BEGIN,
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by "
        f"`scripts/benchmark-report.py{' --firecracker FIRECRACKER' if args.firecracker else ''}` "
        f"at {run(['git', 'log', '--oneline', '-1', '--format=%h']).strip()}"
        f"{' (with uncommitted changes)' if run(['git', 'status', '--porcelain']).strip() else ''}"
        f"; host: {host()}; load average {load()} at the start.",
        "",
        "| row | ours | baseline or peer | which | ratio (ours / theirs; below 1: ours faster) |",
        "|---|---|---|---|---|",
    ]
    for name, ours, theirs, which, ratio in allocator_rows(args.iterations):
        lines.append(f"| LLFree {name} | {ours} | {theirs} | {which} | {ratio:.2f} |")
    if args.firecracker:
        peer = run([args.firecracker, "--version"]).splitlines()[0].strip()
        for name, ours, theirs, ratio in firecracker_rows(args.firecracker, args.runs,
                                                          args.sizes, args.clones):
            lines.append(f"| VMM {name} | {ours} | {theirs} | {peer} | {ratio} |")
    else:
        lines.append("| VMM rows beside Firecracker | not measured in this run (no "
                     "`--firecracker`) | | | |")
    lines += ["", f"Load average at the end: {load()}.", "", END]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--firecracker", help="a firecracker binary to measure beside ours")
    parser.add_argument("--runs", type=int, default=10, help="boots of each VMM")
    parser.add_argument("--sizes", default="1", help="snapshot sizes in GiB, comma-separated")
    parser.add_argument("--iterations", type=int, default=5, help="allocator iterations")
    parser.add_argument("--clones", type=int, default=10,
                        help="VMs loaded at once from one snapshot of a 128 MiB guest")
    parser.add_argument("--print", action="store_true", help="print instead of writing")
    args = parser.parse_args()
    run(["cargo", "build", "--release", "-q", "-p", "llfree-bench", "-p", "vmm-cli",
         "-p", "e2e-tests", "--bin", "llfree-bench", "--bin", "vmm", "--bin",
         "firecracker-compare"])
    text = section(args)
    if args.print:
        print(text)
        return
    report = open(REPORT).read()
    start, end = report.find(BEGIN), report.find(END)
    if start < 0 or end < start:
        sys.exit(f"error: {REPORT} has no {BEGIN} ... {END} section")
    with open(REPORT, "w") as out:
        out.write(report[:start] + text + report[end + len(END):])
    print(text)


if __name__ == "__main__":
    main()
