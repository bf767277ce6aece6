"""PyTorch peer for `make bench`: the rows of bench/*.lua measured through
PyTorch with the same sizes, repeats and timing (sizes as bench/benchlib.lua),
printed as `row KEY VALUE UNIT LABEL` / `check KEY ok|FAILED why` lines for
bench/run.lua.  The allocating forms of bench/alloc.lua are written as a
PyTorch user writes them.  Needs a CUDA build of torch; BENCH_QUICK=1 for
small sizes."""
import os
import statistics
import sys
import time

import torch

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
LAUNCHES, LAUNCH_REPS, ROUNDTRIPS = (200, 5, 50) if QUICK else (2000, 21, 500)
COPY_BYTES, COPY_WARM, COPY_REPS = ((8 << 20) if QUICK else (256 << 20)), 2, (3 if QUICK else 10)
PAGE_SMALL, PAGE_REPS = 4 << 20, (5 if QUICK else 20)
SEEDS_ELEMS, SEEDS_BATCHES, SEEDS_WARM, SEEDS_STEPS, SEEDS_RUNS = \
    ((1 << 20, 8, 2, 20, 3) if QUICK else (4 << 20, 8, 10, 200, 3))
MM_N = 512 if QUICK else 8192
MM = {"f32": (1, 3) if QUICK else (2, 5), "bf16": (1, 3) if QUICK else (3, 10)}
MM_BMM = (4, 128) if QUICK else (64, 1024)   # the batched row: batch, n (bench/benchlib.lua)
OV_BATCHES, OV_BIG, OV_SMALL, OV_RUNS = (8, 1 << 16, 1 << 12, 3) if QUICK else (32, 1 << 24, 1 << 18, 3)
ALLOC_CALLS, ALLOC_REPS = (200, 5) if QUICK else (20000, 11)
LIVE_CALLS, LIVE_TENSORS = (500 if QUICK else 2000), (1000, 100000)
LOOP_ELEMS, LOOP_ITERS, LOOP_WARM, LOOP_REPS = (16 << 20, 30, 1, 1) if QUICK else (256 << 20, 300, 10, 3)
GRAPH_NODES, GRAPH_REPLAYS, GRAPH_WARM, GRAPH_REPS = (100, 20, 1, 5) if QUICK else (100, 200, 2, 21)

failed = False


def row(key, value, unit, label):
    print(f"row {key} {value:.6g} {unit} {label}", flush=True)


def check(key, ok, why=""):
    global failed
    print(f"check {key} {'ok' if ok else 'FAILED ' + why}", flush=True)
    failed = failed or not ok


def size_label(what, nbytes):
    return f"{what} {nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{what} {nbytes >> 10} KiB"


def bytes_label(nbytes):
    """as bench/benchlib.lua's bytes_names: 64 MiB, 1 GiB"""
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or nbytes % 1024:
            return f"{nbytes} {unit}"
        nbytes //= 1024
    return f"{nbytes} GiB"


def count_name(n):
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def event():
    return torch.cuda.Event(enable_timing=True)


def timed_ms(stream, fn, warm, reps):
    """median ms of what fn enqueues on stream, between two events"""
    t = []
    for r in range(-warm, reps):
        e0, e1 = event(), event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        if r >= 0:
            t.append(e0.elapsed_time(e1))
    return statistics.median(t)


def bench_launch(s):
    t = torch.empty(1, device="cuda")

    def per_call(n, body):
        v = []
        for r in range(LAUNCH_REPS + 1):
            t0 = time.perf_counter()
            body(n)
            t1 = time.perf_counter()
            s.synchronize()
            if r > 0:
                v.append((t1 - t0) / n * 1e6)
        return statistics.median(v)

    with torch.cuda.stream(s):
        def fills(n):
            for i in range(n):
                t.fill_(i + 1)
        row("enqueue_fill", per_call(LAUNCHES, fills), "us", "enqueue, fill of 1 element")
        check("enqueue_fill", t.item() == LAUNCHES, f"element is {t.item()}")

        def trips(n):
            for i in range(n):
                t.fill_(i + 1)
                s.synchronize()
        row("roundtrip_fill", per_call(ROUNDTRIPS, trips), "us", "launch + stream sync, fill of 1 element")
        check("roundtrip_fill", t.item() == ROUNDTRIPS, f"element is {t.item()}")


def per_call(n, body, reps=ALLOC_REPS):
    """median us per call of body(n) (n calls), host wall time; the device
    drained between repeats outside the timed part; r = 0 warms up"""
    v = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        body(n)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if r > 0:
            v.append((t1 - t0) / n * 1e6)
    return statistics.median(v)


def minmax(u):
    return u.min().item(), u.max().item()


def bench_loop_1g():
    """the 1 GiB temporaries loop: iterations per second, and the peak of
    allocated memory from a reset just before the timed loops"""
    n, iters = LOOP_ELEMS, LOOP_ITERS
    what = f"{bytes_label(n * 4)} x {iters}"
    t = torch.ones(n, device="cuda")
    for _ in range(LOOP_WARM):
        u = (t * 2 + 1).relu()
    del u
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    its, done = [], 0
    for _ in range(LOOP_REPS):
        done = 0
        t0 = time.perf_counter()
        for i in range(iters):
            u = (t * 2 + 1).relu()
            done = i + 1
        torch.cuda.synchronize()
        its.append(iters / (time.perf_counter() - t0))
        del u  # each timed loop starts as the first: no result of the last one alive
    peak = torch.cuda.max_memory_allocated() / 2 ** 30
    row("loop_1g_its", statistics.median(its), "it/s", f"`u = (t * 2 + 1).relu()` loop, {what}")
    row("loop_1g_peak", peak, "GiB", f"peak memory of that loop, {what}")
    print(f"note loop_1g loop_1g torch: {what}, warm-up {LOOP_WARM} iterations, median of {LOOP_REPS} loops; "
          "peak: torch.cuda.max_memory_allocated since reset_peak_memory_stats()", flush=True)
    lo, hi = minmax((t * 2 + 1).relu())
    check("loop_1g", done == iters and lo == 3 and hi == 3,
          f"{done} of {iters} iterations, last result in [{lo}, {hi}], want 3")


def alloc_row(got, key, label, n, body, last, want):
    """an allocating form: body(calls) is the timed loop, last() one more
    result of it; every element equal to want (None: any), and the loop's
    memory all freed"""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    us = per_call(ALLOC_CALLS, body)
    row(key, us, "us", label)
    got[key] = us
    u = last()
    numel, lo, hi = u.numel(), want, want
    if want is not None:
        lo, hi = minmax(u)
    del u
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - base
    check(key, numel == n and lo == want and hi == want and left == 0,
          f"{numel} elements (want {n}), values in [{lo}, {hi}] (want {want}), {left} bytes left after the loop")


def bench_alloc_sized(got, n, tag, what):
    def empties(calls):
        for _ in range(calls):
            u = torch.empty(n, device="cuda")

    alloc_row(got, "alloc_empty_" + tag, f"`u = torch.empty(n, device='cuda')`, {what}", n, empties,
              lambda: torch.empty(n, device="cuda"), None)
    t = torch.ones(n, device="cuda")

    def adds(calls):
        for _ in range(calls):
            u = t + 1

    alloc_row(got, "alloc_add_" + tag, f"`u = t + 1`, {what}", n, adds, lambda: t + 1, 2)

    def chains(calls):
        for _ in range(calls):
            u = (t * 2 + 1).relu()

    alloc_row(got, "alloc_chain_" + tag, f"`u = (t * 2 + 1).relu()`, {what}", n, chains,
              lambda: (t * 2 + 1).relu(), 3)

    def inplace(calls):
        for _ in range(calls):
            t.add_(1)

    key = "inplace_add_" + tag
    got[key] = per_call(ALLOC_CALLS, inplace)
    row(key, got[key], "us", f"`t.add_(1)`, {what}")
    want = 1 + ALLOC_CALLS * (ALLOC_REPS + 1)
    lo, hi = minmax(t)
    check(key, lo == want and hi == want, f"values in [{lo}, {hi}], want {want}")


def bench_alloc():
    got = {}
    for n, tag, what in ((1, "1", "1 element"), (1 << 18, "256k", "2^18 f32 (1 MiB)")):
        bench_alloc_sized(got, n, tag, what)
    if "alloc_add_256k" in got and "inplace_add_256k" in got:
        row("alloc_vs_inplace_256k", got["alloc_add_256k"] / got["inplace_add_256k"], "x",
            "`u = t + 1` / `t.add_(1)`, 2^18 f32 (1 MiB)")
    print(f"note alloc alloc rows torch: {ALLOC_CALLS} calls per repeat, median of {ALLOC_REPS}", flush=True)

    # the caching allocator beside a live set; streams have no twin here:
    # torch.cuda.Stream() hands out streams of a fixed pool and has no close
    def empties(calls):
        for _ in range(calls):
            u = torch.empty(1, device="cuda")

    us = []
    for count in LIVE_TENSORS:
        key = "alloc_live_" + count_name(count)
        torch.cuda.synchronize()
        base = torch.cuda.memory_stats().get("active.all.current", 0)
        keep = [torch.empty(1, device="cuda") for _ in range(count)]
        us.append(per_call(LIVE_CALLS, empties))
        row(key, us[-1], "us", f"`u = torch.empty(1, device='cuda')`, {count} live")
        alive = torch.cuda.memory_stats().get("active.all.current", 0) - base
        check(key, alive == count and len(keep) == count, f"{alive} live after the loop, want {count}")
        del keep
    row("alloc_live_ratio", us[1] / us[0], "x",
        f"torch.empty(1), {count_name(LIVE_TENSORS[1])} live / {count_name(LIVE_TENSORS[0])} live")
    print(f"note live live rows torch: torch.empty {LIVE_CALLS} calls per repeat, median of {ALLOC_REPS}; "
          "no stream rows (torch.cuda.Stream() hands out streams of a fixed pool)", flush=True)


def bench_copy(s, s2):
    n = COPY_BYTES // 4
    h = torch.arange(n, dtype=torch.int32).pin_memory()
    h2 = torch.empty(n, dtype=torch.int32).pin_memory()
    d = torch.empty(n, dtype=torch.int32, device="cuda")
    d2 = torch.empty_like(d)
    gb = lambda moved, ms: moved / (ms * 1e6)

    with torch.cuda.stream(s):
        ms = timed_ms(s, lambda: d.copy_(h, non_blocking=True), COPY_WARM, COPY_REPS)
        row("h2d", gb(COPY_BYTES, ms), "GB/s", size_label("H2D pinned", COPY_BYTES))
        check("h2d", torch.equal(d.cpu(), h), "device data differs")

        h2.fill_(-1)
        ms = timed_ms(s, lambda: h2.copy_(d, non_blocking=True), COPY_WARM, COPY_REPS)
        row("d2h", gb(COPY_BYTES, ms), "GB/s", size_label("D2H pinned", COPY_BYTES))
        check("d2h", torch.equal(h2, h), "host data differs")

        d2.copy_(d)
        h2.fill_(-1)

        def both():
            start = torch.cuda.Event()
            start.record(s)
            s2.wait_event(start)
            d.copy_(h, non_blocking=True)
            with torch.cuda.stream(s2):
                h2.copy_(d2, non_blocking=True)
            done = torch.cuda.Event()
            done.record(s2)
            s.wait_event(done)
        ms = timed_ms(s, both, COPY_WARM, COPY_REPS)
        torch.cuda.synchronize()
        row("bidir", gb(2 * COPY_BYTES, ms), "GB/s", size_label("H2D + D2H at once, pinned", COPY_BYTES))
        check("bidir", torch.equal(h2, h), "D2H data differs")

        d2.fill_(-1)
        ms = timed_ms(s, lambda: d2.copy_(d), COPY_WARM, COPY_REPS)
        row("d2d", gb(2 * COPY_BYTES, ms), "GB/s", size_label("D2D copy (read + write)", COPY_BYTES))
        check("d2d", torch.equal(d2, d), "copy differs")
        del h, h2, d, d2

        g1 = torch.Generator(device="cuda").manual_seed(1)
        g2 = torch.Generator(device="cuda").manual_seed(2)
        a = torch.rand(n, device="cuda", generator=g1)
        b = torch.rand(n, device="cuda", generator=g2)
        c = torch.full((n,), float("nan"), device="cuda")
        ms = timed_ms(s, lambda: torch.add(a, b, out=c), COPY_WARM, COPY_REPS)
        row("add", gb(3 * COPY_BYTES, ms), "GB/s", size_label("add f32 a+b->c", COPY_BYTES))
        err = (c.double() - a.double() - b.double()).abs().max().item()
        check("add", err <= 2 ** -24, f"max |c - (a + b)| = {err}")
        torch.cuda.synchronize()


def bench_pageable():
    """pageable memory as a user moves it: x.to('cuda'), y.to('cpu') (blocking);
    wall time of the call and a device sync, as bench/copy.lua times gpulua"""
    for tag, nbytes, reps in (("", COPY_BYTES, COPY_REPS), ("_4m", PAGE_SMALL, PAGE_REPS)):
        n = nbytes // 4
        h = torch.arange(n, dtype=torch.int32)
        for key, fn in (("h2d_pageable", lambda: h.to("cuda")), ("d2h_pageable", lambda: d.to("cpu"))):
            t, out = [], None
            for r in range(-COPY_WARM, reps):
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                if r >= 0:
                    t.append((time.perf_counter() - t0) * 1e3)
            what = "H2D pageable, x.to('cuda')" if key == "h2d_pageable" else "D2H pageable, x.to('cpu')"
            row(key + tag, nbytes / (statistics.median(t) * 1e6), "GB/s", size_label(what, nbytes))
            check(key + tag, torch.equal(out.cpu(), h), "data differs")
            d = out if key == "h2d_pageable" else None
        del h, d


def bench_seeds():
    """the seeds' loop: a pageable batch to the device and computed, per step"""
    data = [torch.full((SEEDS_ELEMS,), float(k)) for k in range(1, SEEDS_BATCHES + 1)]
    last = None

    def step(i):
        nonlocal last
        x = data[i % SEEDS_BATCHES].to("cuda")
        last = ((x * 2 + 1).relu()).sum()

    rates = []
    for _ in range(SEEDS_RUNS):
        for i in range(SEEDS_WARM):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(SEEDS_STEPS):
            step(i)
        torch.cuda.synchronize()
        rates.append(SEEDS_STEPS / (time.perf_counter() - t0))
    row("seeds_loop", statistics.median(rates), "it/s",
        f"seeds' loop: {size_label('', SEEDS_ELEMS * 4)[1:]} pageable batch .to('cuda') + (x*2+1).relu().sum(), steps/s")
    k = (SEEDS_STEPS - 1) % SEEDS_BATCHES + 1
    check("seeds_loop", last.item() == SEEDS_ELEMS * (2 * k + 1), f"last step's sum {last.item()}")


def bench_ops(s):
    """bench/ops.lua's rows: the bandwidth-bound ops into out tensors, and
    softmax over rows of 4096 f32 (the row with a target)"""
    n = COPY_BYTES // 4
    gb = lambda moved, ms: moved / (ms * 1e6)
    with torch.cuda.stream(s):
        a = torch.rand(n, device="cuda") * 2 - 1
        b = torch.rand(n, device="cuda") * 2 - 1
        c = torch.empty(n, device="cuda", dtype=torch.bool)
        ms = timed_ms(s, lambda: torch.lt(a, b, out=c), COPY_WARM, COPY_REPS)
        row("op_lt", gb(n * 9, ms), "GB/s", size_label("a:lt(b) -> bool", COPY_BYTES))
        cond, out = a > 0, torch.empty(n, device="cuda")
        ms = timed_ms(s, lambda: torch.where(cond, a, b, out=out), COPY_WARM, COPY_REPS)
        row("op_where", gb(n * 13, ms), "GB/s", size_label("gpu.where(c, a, b)", COPY_BYTES))
        ms = timed_ms(s, lambda: torch.clamp(a, -0.5, 0.5, out=out), COPY_WARM, COPY_REPS)
        row("op_clamp", gb(n * 8, ms), "GB/s", size_label("a:clamp(-0.5, 0.5)", COPY_BYTES))
        h1, h2 = a[: n // 2], b[n // 2:]
        ms = timed_ms(s, lambda: torch.cat((h1, h2), 0, out=out), COPY_WARM, COPY_REPS)
        row("op_cat", gb(n * 8, ms), "GB/s", size_label("gpu.cat of two halves", COPY_BYTES))
        side = int(n ** 0.5)
        m = a[: side * side].view(side, side)
        mt = torch.empty(side, side, device="cuda")
        ms = timed_ms(s, lambda: mt.copy_(m.t()), COPY_WARM, COPY_REPS)
        row("op_transpose", gb(side * side * 8, ms), "GB/s", f"m:t() copied contiguous, {side} x {side} f32")
        ms = timed_ms(s, lambda: torch.flip(a, (0,)), COPY_WARM, COPY_REPS)
        row("op_flip", gb(n * 8, ms), "GB/s", size_label("a:flip(1)", COPY_BYTES))
        cols = 1024
        rows = n // cols
        src = a[: rows * cols].view(rows, cols)
        idx = torch.randint(0, cols, (rows, cols), device="cuda")
        g = torch.empty(rows, cols, device="cuda")
        ms = timed_ms(s, lambda: torch.gather(src, 1, idx, out=g), COPY_WARM, COPY_REPS)
        row("op_gather", gb(rows * cols * 16, ms), "GB/s", f"a:gather(2, idx) {rows} x {cols} f32, i64 index")
        cols = 4096
        rows = n // cols
        x = a[: rows * cols].view(rows, cols)
        y = torch.empty(rows, cols, device="cuda")
        ms = timed_ms(s, lambda: torch.softmax(x, 1, out=y), COPY_WARM, COPY_REPS)
        row("softmax_4096", ms * 1e3, "us", f"softmax over rows, {rows} x {cols} f32")
        err = abs(y[rows // 2].double().sum().item() - 1)
        check("softmax_4096", err < 1e-4, f"a row sums to 1 +- {err:.3g}")
        o0 = torch.empty((), device="cuda")
        ms = timed_ms(s, lambda: torch.sum(a, 0, out=o0), COPY_WARM, COPY_REPS)
        row("op_sum", gb(n * 4, ms), "GB/s", size_label("x.sum() f32, bytes read", COPY_BYTES))
        want = a.double().sum().item()
        check("op_sum", abs(o0.item() - want) <= 1e-6 * n, f"{o0.item()} against {want} in f64")
        del a, b, c, cond, out, m, mt, src, idx, g, x, y
        torch.cuda.synchronize()
        # sort and topk (issue 34): 1M f32, 64 rows of 1M (quick: 2), k = 16
        ln = 1 << 20
        rows = 64 if COPY_BYTES >= (256 << 20) else 2
        x1 = torch.rand(ln, device="cuda")
        xm = torch.rand(rows, ln, device="cuda")
        ms = timed_ms(s, lambda: torch.sort(x1, stable=True), COPY_WARM, COPY_REPS)
        row("sort_1m", ms * 1e3, "us", "sort of 1M f32, values and indices")
        v = torch.sort(x1, stable=True).values
        check("sort_1m", bool((v[1:] >= v[:-1]).all().item()), "in order")
        ms = timed_ms(s, lambda: torch.sort(xm, dim=1, stable=True), COPY_WARM, COPY_REPS)
        row("sort_64x1m", ms * 1e3, "us", f"sort of {rows} rows of 1M f32, values and indices")
        ms = timed_ms(s, lambda: torch.topk(xm, 16, dim=1), COPY_WARM, COPY_REPS)
        row("topk_16", ms * 1e3, "us", f"topk(16) of {rows} rows of 1M f32")
        tv = torch.topk(xm, 16, dim=1).values
        check("topk_16", tv[0, 0].item() == xm[0].max().item(), "the first is the row's max")
        del x1, xm, v, tv
        torch.cuda.synchronize()


def bench_matmul(s):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    n = MM_N
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        key = "matmul_" + name
        warm, reps = MM[name]
        with torch.cuda.stream(s):
            a = torch.rand(n, n, device="cuda").to(dt)
            b = torch.rand(n, n, device="cuda").to(dt)
            c = torch.full((n, n), float("nan"), device="cuda", dtype=dt)
            ms = timed_ms(s, lambda: torch.matmul(a, b, out=c), warm, reps)
            row(key, 2 * n ** 3 / (ms * 1e9), "TFLOP/s", f"matmul {n}^3 {name}")
            worst = 0.0
            for i, j in ((0, 0), (n - 1, n - 1), (n // 3, 2 * n // 3), (n // 2 + 1, 7)):
                p = a[i, :].double() * b[:, j].double()
                err = abs(c[i, j].double().item() - p.sum().item()) / max(p.abs().sum().item(), 1e-300)
                worst = err if not err <= worst else worst
            check(key, worst <= (1e-2 if name == "bf16" else 1e-4), f"relative error {worst:.3g}")
            del a, b, c
            torch.cuda.synchronize()
    # the layouts taken without a copy: a.t() @ b, and a batch (torch.bmm)
    warm, reps = MM["bf16"]
    nb, bn = MM_BMM
    for key, label, shape_a, flops in (
            ("matmul_t_bf16", f"matmul a.t() @ b {n}^3 bf16", (n, n), 2 * n ** 3),
            ("matmul_bmm_bf16", f"matmul {nb} x {bn}^3 bf16, batched", (nb, bn, bn), 2 * nb * bn ** 3)):
        with torch.cuda.stream(s):
            a = torch.rand(*shape_a, device="cuda").to(torch.bfloat16)
            b = torch.rand(*shape_a, device="cuda").to(torch.bfloat16)
            if key == "matmul_t_bf16":
                at = a.t()
                c = torch.matmul(at, b)
                fn = lambda: torch.matmul(at, b, out=c)
                ref = at[5, :].double() @ b[:, 9].double()
                got, mag = c[5, 9], (at[5, :].double().abs() @ b[:, 9].double().abs())
            else:
                c = torch.bmm(a, b)
                fn = lambda: torch.bmm(a, b, out=c)
                ref = a[1, 5, :].double() @ b[1, :, 9].double()
                got, mag = c[1, 5, 9], (a[1, 5, :].double().abs() @ b[1, :, 9].double().abs())
            ms = timed_ms(s, fn, warm, reps)
            row(key, flops / (ms * 1e9), "TFLOP/s", label)
            err = abs(got.double().item() - ref.item()) / max(mag.item(), 1e-300)
            check(key, err <= 1e-2, f"relative error {err:.3g}")
            del a, b, c
            torch.cuda.synchronize()


def bench_overlap(key, nb, n):
    """the schedule of scripts/overlap.lua: pinned batches ready before the
    timed region, H2D on a copy stream, in-place compute on a compute stream
    with a calibrated number of passes, events between them"""
    cs, ks = torch.cuda.Stream(), torch.cuda.Stream()
    ramp = torch.arange(n, dtype=torch.float32) / n
    src = [(ramp + b).pin_memory() for b in range(1, nb + 1)]
    dev = [torch.empty(n, device="cuda") for _ in range(2)]
    copy_done = [torch.cuda.Event() for _ in range(2)]
    comp_done = [torch.cuda.Event() for _ in range(2)]

    def compute(x, passes):
        x.mul_(2).sub_(1).relu_()
        for p in range(1, passes + 1):
            x.mul_(2 if p % 2 else 0.5)
        return x.sum(), x.min(), x.max()

    def time_on(stream, fn):
        t = []
        with torch.cuda.stream(stream):
            for _ in range(3):
                e0, e1 = event(), event()
                e0.record(stream)
                fn()
                e1.record(stream)
                e1.synchronize()
                t.append(e0.elapsed_time(e1))
        return statistics.median(t)

    copy_ms = time_on(cs, lambda: dev[0].copy_(src[0], non_blocking=True))
    fixed_ms = time_on(ks, lambda: compute(dev[0], 0))
    pair_ms = time_on(ks, lambda: dev[0].mul_(2).mul_(0.5))
    passes = min(4096, 2 * max(0, int((copy_ms - fixed_ms) / (2 * pair_ms) + 0.5)))

    effs, bad = [], 0
    for _ in range(OV_RUNS):
        torch.cuda.synchronize()
        results, tm = [], []
        start, stop = event(), event()
        start.record(cs)
        ks.wait_event(start)
        for b in range(nb):
            k = b % 2
            e = [event() for _ in range(4)]
            if b >= 2:
                cs.wait_event(comp_done[k])
            with torch.cuda.stream(cs):
                e[0].record(cs)
                dev[k].copy_(src[b], non_blocking=True)
                e[1].record(cs)
                copy_done[k].record(cs)
            ks.wait_event(copy_done[k])
            with torch.cuda.stream(ks):
                e[2].record(ks)
                results.append(compute(dev[k], passes))
                e[3].record(ks)
                comp_done[k].record(ks)
            tm.append(e)
        stop.record(ks)
        torch.cuda.synchronize()
        for b, (sm, lo, hi) in enumerate(results, start=1):
            want_sum, want_hi = 2.0 * n * b - 1, 2 * b - 1 + 2 * (n - 1) / n
            ok = (lo.item() == 2 * b - 1 and abs(hi.item() - want_hi) <= 4 * 2 ** -23 * want_hi
                  and abs(sm.item() - want_sum) <= 1e-4 * want_sum)
            bad += not ok
        copy_t = sum(e[0].elapsed_time(e[1]) for e in tm)
        comp_t = sum(e[2].elapsed_time(e[3]) for e in tm)
        ideal = max(copy_t, comp_t) + min(copy_t, comp_t) / nb
        effs.append(ideal / start.elapsed_time(stop))
    nbytes = n * 4
    row(key, statistics.median(effs), "eff", f"overlap {nb} x {size_label('', nbytes)[1:]}, efficiency")
    print(f"note {key} torch: {passes} compute passes per batch; median of {OV_RUNS} runs", flush=True)
    check(key, bad == 0, f"closed-form check failed for {bad} batches")


def bench_graph(s):
    """a torch.cuda.CUDAGraph of GRAPH_NODES in-place adds on a 1-element
    tensor, replayed: events around a batch of GRAPH_REPLAYS replays on s,
    after GRAPH_WARM batches; time per node, median of GRAPH_REPS batches
    (as bench/graph.lua and bench/ref.cu's bench_graph)"""
    x = torch.zeros(1, device="cuda")
    # the warm-up PyTorch asks for before a capture, on a side stream; then
    # x back to 0 before the captured adds (which do not run at capture)
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
        x.zero_()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_NODES):
            x.add_(1)
    torch.cuda.synchronize()
    t = []
    with torch.cuda.stream(s):
        for r in range(-GRAPH_WARM, GRAPH_REPS):
            e0, e1 = event(), event()
            e0.record(s)
            for _ in range(GRAPH_REPLAYS):
                g.replay()
            e1.record(s)
            e1.synchronize()
            if r >= 0:
                t.append(e0.elapsed_time(e1) * 1e3 / (GRAPH_REPLAYS * GRAPH_NODES))
    row("graph_node", statistics.median(t), "us", f"graph replay, time per node ({GRAPH_NODES} kernels)")
    print(f"note graph_node graph_node torch: torch.cuda.CUDAGraph of {GRAPH_NODES} x.add_(1) (1 element), "
          f"{GRAPH_REPLAYS} replays per batch, median of {GRAPH_REPS} batches after {GRAPH_WARM}", flush=True)
    want = GRAPH_NODES * GRAPH_REPLAYS * (GRAPH_WARM + GRAPH_REPS)
    got = x.item()
    check("graph_node", got == want, f"element is {got}, want {want}")
    del g


def gelu9(x):
    """GELU as 9 ops, as bench/ops.lua writes it"""
    return (((x * x * x * 0.044715 + x) * 0.7978845608).tanh() + 1) * x * 0.5


def per_call_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def bench_fuse(s):
    """bench/ops.lua's fuse rows: the PyTorch column is torch.compile of the
    same 9 ops; cupy.fuse's under the keys *_cupy, when CuPy is there"""
    n = COPY_BYTES // 4
    gb = lambda moved, ms: moved / (ms * 1e6)
    calls = 200 if QUICK else 5000
    comp = torch.compile(gelu9)
    with torch.cuda.stream(s):
        a = torch.rand(n, device="cuda") * 2 - 1
        for dt, esz in ((torch.float32, 4), (torch.bfloat16, 2)):
            x = a.to(dt)
            y = comp(x)
            ms = timed_ms(s, lambda: comp(x), COPY_WARM, COPY_REPS)
            name = "f32" if dt == torch.float32 else "bf16"
            row(f"fuse_gelu_{name}", gb(n * esz * 2, ms), "GB/s",
                size_label(f"gpu.fuse'd GELU (9 ops) {name}", n * esz))
            err = (y.float() - gelu9(x).float()).abs().max().item()
            check(f"fuse_gelu_{name}", err < 1e-2, f"largest difference from eager: {err}")
        rsum = torch.compile(lambda t: (t * 2 + 1).relu().sum())
        rsum(a)
        ms = timed_ms(s, lambda: rsum(a), COPY_WARM, COPY_REPS)
        row("fuse_relu_sum", gb(n * 4, ms), "GB/s", size_label("torch.compile'd (x * 2 + 1).relu().sum() f32, bytes read", n * 4))
        # two reductions of one tensor, one compiled function returning both
        ssq = torch.compile(lambda t: (t.sum(), (t * t).sum()))
        ssq(a)
        ms = timed_ms(s, lambda: ssq(a), COPY_WARM, COPY_REPS)
        row("fuse_sum_sumsq", gb(n * 4, ms), "GB/s", size_label("torch.compile'd (x.sum(), (x * x).sum()) f32, bytes read", n * 4))
        # the Adam step of ops.lua's fuse_adam: torch.optim.Adam(fused=True)
        p = (a * 1).requires_grad_()
        p.grad = torch.rand(n, device="cuda") * 2 - 1
        opt = torch.optim.Adam([p], lr=1e-3, fused=True)
        opt.step()
        ms = timed_ms(s, opt.step, COPY_WARM, COPY_REPS)
        row("fuse_adam", gb(n * 28, ms), "GB/s", size_label("torch.optim.Adam(fused=True) step f32, 7 x", n * 4))
        del p, opt
        one = torch.rand(1, device="cuda")
        row("fuse_add1_1", per_call_us(lambda: one + 1, calls), "us", "t + 1 (built-in), 1 element, per call")
        row("fuse_gelu_1", per_call_us(lambda: comp(one), calls), "us", "gpu.fuse'd GELU, 1 element, per call")
        del a, x, y
    try:
        import cupy
    except ImportError:
        print("note fuse fuse rows: no CuPy, no cupy.fuse column", flush=True)
        return
    def gelu9_cupy(x):
        """the same 9 ops; cupy.fuse traces functions (cupy.tanh), not methods"""
        return (cupy.tanh((x * x * x * 0.044715 + x) * 0.7978845608) + 1) * x * 0.5

    cgelu = cupy.fuse(gelu9_cupy)
    x = cupy.random.rand(n, dtype=cupy.float32) * 2 - 1
    cgelu(x)
    def relu_sum(v):
        """cupy.fuse names the kernel after the function: not a lambda"""
        return cupy.sum(cupy.maximum(v * 2 + 1, 0))

    crsum = cupy.fuse(relu_sum)
    crsum(x)

    def sum_sumsq(v):
        """two reductions returned by one fused function (CuPy's new fusion
        takes them; where a CuPy does not, the row is left out)"""
        return cupy.sum(v), cupy.sum(v * v)

    cssq = cupy.fuse(sum_sumsq)
    try:
        got = cssq(x)
        want = (cupy.sum(x), cupy.sum(x * x))
        if not all(abs(float(g) - float(w)) <= 1e-5 * abs(float(w)) for g, w in zip(got, want)):
            raise ValueError(f"{[float(g) for g in got]}, unfused {[float(w) for w in want]}")
    except Exception as e:  # a CuPy that refuses (or miscomputes) it: no row, not a failure
        print(f"note fuse_sum_sumsq_cupy: cupy.fuse of two reductions: {type(e).__name__}: {e}", flush=True)
        cssq = None
    cs = cupy.cuda.Stream(non_blocking=True)

    def cupy_ms(fn):
        """the median of fn's times on cs, as timed_ms does for torch"""
        t = []
        for r in range(-COPY_WARM, COPY_REPS):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(cs)
            fn()
            e1.record(cs)
            e1.synchronize()
            if r >= 0:
                t.append(cupy.cuda.get_elapsed_time(e0, e1))
        return statistics.median(t)

    with cs:
        row("fuse_gelu_f32_cupy", gb(n * 8, cupy_ms(lambda: cgelu(x))), "GB/s", size_label("cupy.fuse'd GELU f32", n * 4))
        row("fuse_relu_sum_cupy", gb(n * 4, cupy_ms(lambda: crsum(x))), "GB/s",
            size_label("cupy.fuse'd (x * 2 + 1).relu().sum() f32, bytes read", n * 4))
        if cssq is not None:
            row("fuse_sum_sumsq_cupy", gb(n * 4, cupy_ms(lambda: cssq(x))), "GB/s",
                size_label("cupy.fuse'd (sum(x), sum(x * x)) f32, bytes read", n * 4))
        one = cupy.random.rand(1, dtype=cupy.float32)

        def per_call(fn):
            for _ in range(20):
                fn()
            cs.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            cs.synchronize()
            return (time.perf_counter() - t0) / calls * 1e6
        row("fuse_gelu_1_cupy", per_call(lambda: cgelu(one)), "us", "cupy.fuse'd GELU, 1 element, per call")


# ---- issue 36: DDP and ZeRO of scripts/zero.lua's model, on 2 GPUs ----------

# the sizes and steps of bench/run.lua's runs of scripts/zero.lua (steps=23
# warm=3: 3 steps of warm-up, then the mean of 20, wall clock, the slowest
# rank's; BENCH_QUICK: width=256 layers=3 batch=16 steps=7 warm=2)
ZERO_WIDTH, ZERO_LAYERS, ZERO_BATCH = (256, 3, 16) if QUICK else (4096, 6, 64)
ZERO_WARM, ZERO_STEPS = (2, 5) if QUICK else (3, 20)


def zero_rank(rank, world, port, kind):
    """one rank of the DDP or ZeroRedundancyOptimizer run; rank 0 prints the rows"""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dev = torch.device("cuda", rank)
        d, b = ZERO_WIDTH, ZERO_BATCH
        torch.manual_seed(1)   # the same start on every rank (DDP broadcasts it anyway)
        layers = []
        for i in range(ZERO_LAYERS):
            layers.append(torch.nn.Linear(d, d))
            if i < ZERO_LAYERS - 1:
                layers.append(torch.nn.ReLU())
        model = DDP(torch.nn.Sequential(*layers).to(dev), device_ids=[rank])
        teacher = torch.randn(d, d, device=dev) / d ** 0.5
        if kind == "ddp":
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        gen = torch.Generator(device=dev)
        gen.manual_seed(1000 + rank)

        mem = []

        def step():
            x = torch.randn(b, d, device=dev, generator=gen)
            y = x @ teacher
            opt.zero_grad(set_to_none=True)
            loss = (model(x) - y).pow(2).sum() * (0.5 / b)   # scripts/zero.lua's loss
            loss.backward()
            if not mem:
                torch.cuda.synchronize()
                mem.append(torch.cuda.memory_allocated(dev))
            opt.step()
            if len(mem) == 1:
                # Adam makes its state (m, v, step) at the first step: what
                # that step leaves allocated, as zero.lua's gpu.memory() delta
                torch.cuda.synchronize()
                mem.append(torch.cuda.memory_allocated(dev))
            return loss

        first = step().item()
        for _ in range(ZERO_WARM - 1):
            step()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ZERO_STEPS):
            last = step()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / ZERO_STEPS * 1e6
        # the optimizer state this rank holds: the first step's
        # memory_allocated delta; beside it, the sum of Adam's state tensors
        inner = opt.optim if kind == "zero" else opt
        tensors = sum(t.numel() * t.element_size() for st in inner.state.values()
                      for t in st.values() if torch.is_tensor(t))
        state = mem[1] - mem[0]
        t = torch.tensor([us], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)   # the slowest rank's time per step
        if rank == 0:
            n = sum(p.numel() for p in model.parameters())
            what = f"{ZERO_LAYERS} x Linear({d}, {d}), {n / 1e6:.1f}M parameters, batch {b} per rank, Adam"
            key = "zero_ddp" if kind == "ddp" else "zero2"
            name = "DistributedDataParallel" if kind == "ddp" else "DDP + ZeroRedundancyOptimizer"
            row(key + "_step", t.item(), "us", f"{name} step on {world} GPUs, {what}")
            row(key + "_optim_mem", state / (1 << 20), "MiB", f"{name}: optimizer state per rank")
            check(key, last.item() < first, f"loss {first} -> {last.item()}")
            print(f"note {key} {key} torch: {name}, {world} ranks, warm-up {ZERO_WARM} steps, "
                  f"{ZERO_STEPS} timed (mean, the slowest rank's); loss {first:.4g} -> {last.item():.4g}; "
                  f"optimizer state {state / (1 << 20):.2f} MiB (memory_allocated across the first step; "
                  f"Adam's state tensors {tensors / (1 << 20):.2f} MiB); torch.optim.Adam defaults "
                  f"(foreach), f32 matmuls without TF32 (allow_tf32 {torch.backends.cuda.matmul.allow_tf32})",
                  flush=True)
    finally:
        dist.destroy_process_group()


def bench_zero():
    if torch.cuda.device_count() < 2:
        print("note zero zero torch: skipped, it needs 2 GPUs", flush=True)
        return
    for kind in ("ddp", "zero"):
        spawn2(zero_rank, kind)


# ---- issue 36: the tensor-parallel block of scripts/tensor_parallel.lua, TP 2 -----

# bench/run.lua's `scripts/tensor_parallel.lua 6 32768 width=4096 hidden=16384`:
# Megatron's MLP block, column-parallel W1 then row-parallel W2, f32, 32768
# rows; the same hand-written backward with torch's matmuls; forward+backward
# timed with events around them, the mean of steps 2 to 6, the slowest rank's
TP_WIDTH, TP_HIDDEN, TP_ROWS = (64, 256, 512) if QUICK else (4096, 16384, 32768)
TP_STEPS = 6


def tp_rank(rank, world, port):
    """one rank of the TP block; rank 0 prints the row"""
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dev = torch.device("cuda", rank)
        d, f, n = TP_WIDTH, TP_HIDDEN, TP_ROWS
        fk = f // world
        lr = min(0.02, 5.12 / f)   # scripts/tensor_parallel.lua's step size
        gen = torch.Generator(device=dev)
        gen.manual_seed(1)         # the teacher: the same on both ranks
        tw1 = torch.randn(d, f, device=dev, generator=gen) / d ** 0.5
        tw2 = torch.randn(f, d, device=dev, generator=gen) / f ** 0.5
        gen.manual_seed(2 + rank)  # this rank's slices
        w1 = torch.randn(d, fk, device=dev, generator=gen) / d ** 0.5
        b1 = torch.zeros(fk, device=dev)
        w2 = torch.randn(fk, d, device=dev, generator=gen) / f ** 0.5
        b2 = torch.zeros(d, device=dev)
        xgen = torch.Generator(device=dev)
        times = []
        for i in range(1, TP_STEPS + 1):
            xgen.manual_seed(1000 + i)   # the same rows on both ranks of the TP group
            x = torch.randn(n, d, device=dev, generator=xgen)
            t = torch.tanh(x @ tw1) @ tw2
            e0, e1 = event(), event()
            e0.record()
            h = x @ w1 + b1
            a = torch.relu(h)
            y = a @ w2
            dist.all_reduce(y)            # Megatron's g: the partial outputs summed
            y += b2
            dy = (y - t) / n
            gw2 = a.t() @ dy
            gb2 = dy.sum(0)
            dh = torch.where(h > 0, dy @ w2.t(), 0.0)
            gw1 = x.t() @ dh
            gb1 = dh.sum(0)
            dx = dh @ w1.t()
            dist.all_reduce(dx)           # Megatron's f: the input's gradient summed
            e1.record()
            for p, g in ((w1, gw1), (b1, gb1), (w2, gw2), (b2, gb2)):
                p.sub_(g * lr)
            if i > 1:
                times.append((e0, e1))
        torch.cuda.synchronize()
        us = torch.tensor([statistics.mean(s0.elapsed_time(s1) for s0, s1 in times) * 1e3], device=dev)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            row("tp_block_fwd_bwd", us.item(), "us",
                f"TP block forward+backward on {world} GPUs, D {d}, F {f}, {n} rows, f32")
            print(f"note tp_block_fwd_bwd torch: the block with torch matmuls and dist.all_reduce, {world} ranks, "
                  f"events around forward+backward, mean of steps 2 to {TP_STEPS}, the slowest rank's; "
                  f"allow_tf32 {torch.backends.cuda.matmul.allow_tf32}", flush=True)
    finally:
        dist.destroy_process_group()


def bench_npz():
    """bench/formats.lua's npz_deflated: numpy.load of a savez_compressed
    archive of 8 members of randn f32, each member to the device (what a
    PyTorch user writes), then a sync; GB/s of array bytes, median of 5
    after one warm-up."""
    import tempfile
    import numpy as np
    members, each, reps = 8, (1 << 20) if QUICK else (8 << 20), 5
    rng = np.random.default_rng(1)
    arrays = {f"w{i}": rng.standard_normal(each // 4, dtype=np.float32) for i in range(1, members + 1)}
    fd, path = tempfile.mkstemp(suffix=".npz")
    os.close(fd)
    try:
        np.savez_compressed(path, **arrays)
        times = []
        for r in range(reps + 1):
            t0 = time.perf_counter()
            with np.load(path) as z:
                got = {k: torch.from_numpy(z[k]).cuda() for k in z.files}
            torch.cuda.synchronize()
            if r > 0:
                times.append(time.perf_counter() - t0)
        total = members * each
        row("npz_deflated", total / statistics.median(times) / 1e9, "GB/s",
            f"numpy.load of {members} deflated f32 members of {each >> 20} MiB, each .cuda()")
        ok = all(torch.equal(got[k].cpu(), torch.from_numpy(v)) for k, v in arrays.items())
        check("npz_deflated", ok, "the members differ")
    finally:
        os.remove(path)


def spawn2(fn, *args):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sock:   # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(fn, args=(2, port) + args, nprocs=2, join=True)


def bench_tp():
    if torch.cuda.device_count() < 2:
        print("note tp torch: skipped, it needs 2 GPUs", flush=True)
        return
    spawn2(tp_rank)


def main():
    if not torch.cuda.is_available():
        print("check torch FAILED no CUDA device", flush=True)
        return 1
    print(f"info torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    # TORCH_PEER_ONLY=fuse,ops: only those sections; TORCH_PEER_SKIP=zero,tp:
    # all but those (bench/run.lua runs the 2-GPU sections beside gpulua's rows)
    only = [x for x in os.environ.get("TORCH_PEER_ONLY", "").split(",") if x]
    skip = [x for x in os.environ.get("TORCH_PEER_SKIP", "").split(",") if x]
    for name, fn in (("launch", lambda: bench_launch(s)), ("alloc", bench_alloc), ("loop_1g", bench_loop_1g),
                     ("copy", lambda: bench_copy(s, s2)),
                     ("pageable", bench_pageable), ("seeds_loop", bench_seeds),
                     ("matmul", lambda: bench_matmul(s)), ("ops", lambda: bench_ops(s)),
                     ("fuse", lambda: bench_fuse(s)),
                     ("overlap_big", lambda: bench_overlap("overlap_big", OV_BATCHES, OV_BIG)),
                     ("overlap_small", lambda: bench_overlap("overlap_small", OV_BATCHES, OV_SMALL)),
                     ("graph_node", lambda: bench_graph(s)), ("npz", bench_npz), ("zero", bench_zero),
                     ("tp", bench_tp)):
        if (only and name not in only) or name in skip:
            continue
        try:
            fn()
        except Exception as e:  # one section's failure should not hide the others
            check(name, False, f"{type(e).__name__}: {e}".replace("\n", " "))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
