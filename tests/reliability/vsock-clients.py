#!/usr/bin/env python3
# Hostile vsock host clients against `vmm run --vsock` (the built-in guest, no vsock driver):
# 10 runs of 1,000 idle clients opened and dropped (does the VMM live, is its socket left?);
# 50 clients that send CONNECT to a port no driver answers (time until the VMM closes each);
# 1,024 such clients that leave, then one more (is it taken?). The reliability figures of
# BENCHMARKS.md. Usage: vsock-clients.py VMM_BINARY SCRATCH_DIR
import os, socket, subprocess, sys, time, statistics
V = sys.argv[1]; d = sys.argv[2]; os.makedirs(d, exist_ok=True)
def start():
    uds, api = os.path.join(d, "v.sock"), os.path.join(d, "api.sock")
    for p in (uds, api):
        if os.path.exists(p): os.unlink(p)
    vmm = subprocess.Popen([V, "run", "--memory", "64M", "--vsock", f"cid=3,uds={uds}",
                            "--api-socket", api, "--workload", "checkpoint:1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not os.path.exists(uds):
        time.sleep(0.01)
    time.sleep(0.3)
    return vmm, uds
lived = 0; left = 0
for _ in range(10):
    vmm, uds = start()
    conns = []
    for i in range(1000):
        s = socket.socket(socket.AF_UNIX); s.connect(uds); conns.append(s)
    time.sleep(0.5)
    for s in conns: s.close()
    time.sleep(1.0)
    if vmm.poll() is None:
        lived += 1
    else:
        left += os.path.exists(uds)
    vmm.kill(); vmm.wait()
print(f"1,000 idle clients dropped: the VMM lived in {lived} of 10 runs; socket file left in {left} of {10 - lived} deaths")
vmm, uds = start()
clients = []
for i in range(50):
    s = socket.socket(socket.AF_UNIX); s.connect(uds); s.send(b"CONNECT 52\n"); s.setblocking(False)
    clients.append((s, time.monotonic()))
closed = {}
deadline = time.monotonic() + 5
while time.monotonic() < deadline and len(closed) < 50:
    for i, (s, t) in enumerate(clients):
        if i in closed: continue
        try:
            if s.recv(16) == b"": closed[i] = time.monotonic() - t
        except BlockingIOError: pass
    time.sleep(0.005)
times = sorted(closed.values())
if times:
    print(f"CONNECT to an unanswered port: {len(times)} of 50 closed within 5 s, after {statistics.median(times):.2f} s median ({times[0]:.2f}-{times[-1]:.2f})")
else:
    print("CONNECT to an unanswered port: 0 of 50 closed within 5 s")
# A client that leaves: is its place freed? 1,024 clients connect and leave, then one more must be taken.
for s, _ in clients: s.close()
hold = []
for i in range(1024):
    s = socket.socket(socket.AF_UNIX); s.connect(uds); s.send(b"CONNECT 52\n"); hold.append(s)
time.sleep(0.3)
for s in hold: s.close()
time.sleep(0.5)
s = socket.socket(socket.AF_UNIX); s.connect(uds); s.send(b"CONNECT 53\n"); s.settimeout(3.0)
t = time.monotonic()
try:
    data = s.recv(16)
    print(f"after 1,024 clients came and left: a new client was taken, closed {time.monotonic()-t:.2f} s later (its port unanswered)" if data == b"" else f"got {data}")
except socket.timeout:
    print("after 1,024 clients came and left: a new client was not answered in 3 s")
vmm.kill(); vmm.wait()
