"""Where the time before a fit's first progress line goes (issue 14: "progress visible throughout"), phase by phase.

Builds (or reuses) a simulated area-partitioned store as benchmarks/bench_million.py does, then fits it once with
progress on, and prints a timeline with seconds since ``fit`` was called:

- every line the fit writes to stderr (the user's view), as ``+12.34s  out  <line>``;
- phase boundaries measured by wrapping, in this process only, the functions a fit runs through in order:
  the runtime's start-up (``open_runtime``: the embedded LocalCluster), the knot layout (``api.knots.layout``),
  loading the partitions (``Runtime.start``), and the first and last answer of every step of the server
  (moments, variogram, then each round trip), as ``+12.34s  ---  <phase>``.

A JSON row with the seconds of each phase, the time of the first line printed and of the first line after the
runtime was up goes to stdout. With ``--cli`` it runs ``spatialfed fit STORE --out DIR`` as a child process instead
and timestamps its stderr lines as they arrive (what a user of the command sees, interpreter start-up included).

    nice -n 19 python benchmarks/bench_first_output.py --n 2e5 --residual pp --store /tmp/s200k.zarr
    nice -n 19 python benchmarks/bench_first_output.py --n 2e5 --residual mpp --store /tmp/s200k.zarr --reuse --cli
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 19 python benchmarks/bench_first_output.py --n 1e6 \\
        --residual pp --store /tmp/s1m.zarr

Measured numbers: docs/results.md, "Large data: memory and 10⁶ points" (the time to the first progress line).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Timeline:
    """(seconds since t0, kind, text) rows, echoed to the real stderr as they come."""

    def __init__(self, echo=sys.__stderr__):
        self.t0 = time.perf_counter()
        self.rows: list[tuple[float, str, str]] = []
        self.echo = echo
        self.lock = threading.Lock()

    def add(self, kind: str, text: str) -> None:
        t = time.perf_counter() - self.t0
        with self.lock:
            self.rows.append((t, kind, text))
        print(f"+{t:8.2f}s  {kind:3}  {text}", file=self.echo, flush=True)

    def first(self, kind: str, after: float = 0.0):
        return next((t for t, k, _ in self.rows if k == kind and t >= after), None)


class Capture(io.TextIOBase):
    """A text stream that adds every line (and every tqdm carriage-return refresh) to the timeline."""

    def __init__(self, timeline: Timeline):
        self.timeline, self.buf = timeline, ""

    def isatty(self):
        return False

    def write(self, s):
        self.buf += s
        while True:
            cut = min((i for i in (self.buf.find("\n"), self.buf.find("\r")) if i >= 0), default=-1)
            if cut < 0:
                break
            line, self.buf = self.buf[:cut], self.buf[cut + 1:]
            if line.strip():
                self.timeline.add("out", line.strip())
        return len(s)

    def flush(self):
        pass


def instrument(tl: Timeline) -> None:
    """Wrap the fit's phases (this process only) so that each start and end lands on the timeline."""
    import spatialfed.api.estimator as est
    import spatialfed.api.knots as knots
    from spatialfed.outputs.monitor import FitMonitor
    from spatialfed.runtime.dask_runtime import DaskRuntime
    from spatialfed.runtime.virtual import VirtualRuntime

    open_runtime = est.open_runtime

    from contextlib import contextmanager

    @contextmanager
    def timed_open_runtime(*a, **k):
        tl.add("---", "open runtime (cluster start) ...")
        with open_runtime(*a, **k) as rt:
            tl.add("---", f"runtime up ({type(rt).__name__})")
            yield rt

    est.open_runtime = timed_open_runtime

    layout = knots.layout

    def timed_layout(*a, **k):
        tl.add("---", "knot layout ...")
        out = layout(*a, **k)
        tl.add("---", f"knots laid out ({len(out[0])})")
        return out

    knots.layout = timed_layout

    for cls in (DaskRuntime, VirtualRuntime):
        start = cls.start

        def timed_start(self, *a, _start=start, **k):
            tl.add("---", f"{type(self).__name__}.start: loading partitions ...")
            out = _start(self, *a, **k)
            tl.add("---", f"partitions loaded ({len(out)})")
            return out

        cls.start = timed_start

    on_result = FitMonitor.on_result
    seen: dict = {}

    def timed_on_result(self, j, p, q):
        if p is not None:
            key = (p.step, int(p.t))
            count = seen[key] = seen.get(key, 0) + 1
            if count == 1:
                tl.add("---", f"first answer: {p.step} t={p.t}")
            if count == self.n_workers:
                tl.add("---", f"all {count} answers: {p.step} t={p.t}")
        return on_result(self, j, p, q)

    FitMonitor.on_result = timed_on_result


def phases(tl: Timeline) -> dict:
    """Seconds between consecutive phase markers, named by the marker that ends them."""
    marks = [(t, text) for t, k, text in tl.rows if k == "---"]
    out, prev = {}, 0.0
    for t, text in marks:
        out[text] = round(t - prev, 2)
        prev = t
    return out


def run_api(store: Path, args) -> dict:
    from spatialfed.api import FederatedGP

    tl = Timeline()
    instrument(tl)
    capture = Capture(tl)
    real = sys.stderr
    sys.stderr = capture
    try:
        tl.t0 = time.perf_counter()
        gp = FederatedGP(residual=args.residual, knots=args.knots, nu=0.5, mode=args.mode, max_iter=args.max_iter,
                         cluster=args.runtime, n_dask_workers=args.dask_workers if args.runtime == "dask" else None,
                         seed=args.seed, progress=True)
        gp.fit(str(store))
    finally:
        sys.stderr = real
    up = next((t for t, k, text in tl.rows if k == "---" and text.startswith("runtime up")), 0.0)
    return {"first_line_s": tl.first("out"), "first_line_after_runtime_s": tl.first("out", up),
            "fit_total_s": round(time.perf_counter() - tl.t0, 2), "phases_s": phases(tl),
            "iterations": int(gp.n_iter_)}


def run_cli(store: Path, args) -> dict:
    tl = Timeline()
    out = tempfile.mkdtemp(prefix="bench_first_output-")
    cmd = [sys.executable, "-m", "spatialfed", "fit", str(store), "--out", out, "--residual", args.residual,
           "--knots", str(args.knots), "--mode", args.mode, "--max-iter", str(args.max_iter), "--runtime",
           args.runtime]
    if args.runtime == "dask":
        cmd += ["--dask-workers", str(args.dask_workers)]
    tl.add("---", "$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def pump(stream, kind):
        buf = ""
        while True:
            ch = stream.read(1)
            if not ch:
                break
            if ch in "\r\n":
                if buf.strip():
                    tl.add(kind, buf.strip())
                buf = ""
            else:
                buf += ch

    threads = [threading.Thread(target=pump, args=(proc.stderr, "out")),
               threading.Thread(target=pump, args=(proc.stdout, "std"))]
    for th in threads:
        th.start()
    rc = proc.wait()
    for th in threads:
        th.join()
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    gaps = [b - a for (a, *_), (b, *_) in zip(tl.rows, tl.rows[1:])]
    return {"first_line_s": tl.first("out"), "longest_silence_s": round(max(gaps, default=0.0), 2), "rc": rc,
            "total_s": round(time.perf_counter() - tl.t0, 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=2e5)
    ap.add_argument("--workers", type=int, default=100, help="J area sites (default 100)")
    ap.add_argument("--residual", default="pp")
    ap.add_argument("--mode", default="sync")
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--max-iter", type=int, default=1)
    ap.add_argument("--runtime", choices=("dask", "simulated"), default="dask")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true", help="fit the existing --store instead of simulating")
    ap.add_argument("--cli", action="store_true", help="run `spatialfed fit` as a child process")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = int(args.n)
    tmp = None
    store = args.store
    if store is None:
        tmp = tempfile.mkdtemp(prefix="bench_first_output-")
        store = Path(tmp) / "store.zarr"
    try:
        made = {}
        if not args.reuse:
            from harness import make_store

            made = make_store(store, n, args.workers, args.seed)
            made.pop("truth", None)
        row = run_cli(store, args) if args.cli else run_api(store, args)
        print(json.dumps({"n": n, "J": args.workers, "residual": args.residual, "mode": args.mode,
                          "runtime": args.runtime, "cli": args.cli, "load": os.getloadavg()[0], **made, **row}),
              flush=True)
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
