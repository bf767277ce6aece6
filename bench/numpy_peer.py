"""NumPy peer of bench/host.lua for `make bench`: the same rows on 2^20 f32
(2^16 with BENCH_QUICK=1), timed the same way (median over rounds of a loop
sized to about 0.2 s), on one thread (NumPy's elementwise ops and sums do not
spread over threads), printed as `row KEY VALUE us LABEL` lines.  bench/run.lua
runs it with glibc's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ raised,
so that NumPy's temporaries are reused rather than mapped afresh each time:
NumPy at its best."""
import os
import statistics
import time

import numpy as np

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
N = 1 << 16 if QUICK else 1 << 20
ROUNDS = 3 if QUICK else 7
TARGET_S = 0.02 if QUICK else 0.2

x = np.random.default_rng(32).random(N, dtype=np.float32)
f32 = np.float32


def gelu9(t):
    # the same 9 ops as bench/host.lua, one array each
    u = t * t
    u = u * t
    u = u * f32(0.044715)
    u = u + t
    u = u * f32(0.7978845608)
    u = np.tanh(u)
    u = u + f32(1)
    u = u * t
    return u * f32(0.5)


def timed(f):
    f()
    t0 = time.perf_counter()
    f()
    calls = max(3, int(TARGET_S / max(time.perf_counter() - t0, 1e-6)))
    r = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        r.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(r)


ROWS = [
    ("host_add1", "x + 1", lambda: x + f32(1)),
    ("host_exp", "np.exp(x)", lambda: np.exp(x)),
    ("host_tanh", "np.tanh(x)", lambda: np.tanh(x)),
    ("host_chain3", "np.maximum(x * 2 + 1, 0)", lambda: np.maximum(x * f32(2) + f32(1), f32(0))),
    ("host_gelu", "GELU as 9 ops", lambda: gelu9(x)),
    ("host_gelu_fused", "GELU as 9 ops (NumPy does not fuse)", lambda: gelu9(x)),
    ("host_sum", "x.sum()", lambda: x.sum()),
]
for key, label, f in ROWS:
    print("row %s %.6g us NumPy %s: %s" % (key, timed(f), np.__version__, label), flush=True)
