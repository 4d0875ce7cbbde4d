#!/usr/bin/env python3
# Damages each word of a VM's directory slot (all ones, then zero) in a fresh zone and sees
# what the VMM makes of it: harmless (the VM's memory verifies in two runs), refused (a clear
# error naming the damage), or lost (the VM's memory is gone: a run fails or finds zeroes).
# The reliability figures of BENCHMARKS.md. Usage: zone-slot-damage.py VMM_BINARY SCRATCH_DIR
import os, struct, subprocess, sys
V = sys.argv[1]
d = sys.argv[2]
os.makedirs(d, exist_ok=True)
z = os.path.join(d, "zone")
def run(*args):
    return subprocess.run([V, *args], capture_output=True, text=True)
tally = {"harmless": 0, "refused": 0, "lost": 0}
lost = []
for word in range(36):
    for value in (2**64 - 1, 0):
        if os.path.exists(z): os.unlink(z)
        run("zone", "create", z, "--size", "64M")
        assert run("run", "--zone", z, "--vm", "a", "--memory", "32M", "--workload", "write:2M+8M:0x77").returncode == 0
        with open(z, "r+b") as f:
            f.seek(8 * 8); dir_off = struct.unpack("<Q", f.read(8))[0]
            f.seek(dir_off + word * 8); old = f.read(8)
            if struct.unpack("<Q", old)[0] == value: continue
            f.seek(dir_off + word * 8); f.write(struct.pack("<Q", value))
        inspect = run("zone", "inspect", z)
        outcomes = []
        for _ in range(2):
            r = run("run", "--zone", z, "--vm", "a", "--memory", "32M", "--workload", "verify:2M+8M:0x77")
            outcomes.append(r)
        if outcomes[0].returncode == 0 and outcomes[1].returncode == 0:
            tally["harmless"] += 1
        elif outcomes[0].returncode == 2 and "damaged" in outcomes[0].stderr or (outcomes[0].returncode != 0 and "corrupted" in outcomes[0].stderr):
            tally["refused"] += 1
        else:
            tally["lost"] += 1
            lost.append((word, hex(value), outcomes[0].returncode, outcomes[1].returncode))
print(tally, "lost:", lost)
