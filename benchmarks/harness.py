"""What the benchmark scripts share: JSON rows (one per line on stdout, optionally appended to a file), progress
lines on stderr, timing, peak memory, output gaps, and the simulated area-partitioned store they fit."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path


def emitter(out: Path | None):
    """emit(row): print the row as one JSON line (flushed) and append it to `out` when given."""

    def emit(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out is not None:
            with open(out, "a") as fh:
                fh.write(line + "\n")

    return emit


def say(*args) -> None:
    """A progress line on stderr (stdout carries the JSON rows)."""
    print(*args, file=sys.stderr, flush=True)


class _Elapsed:
    s: float = 0.0


@contextmanager
def stopwatch():
    """`with stopwatch() as t: ...` then t.s: the block's wall-clock seconds (time.perf_counter)."""
    elapsed, tic = _Elapsed(), time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed.s = time.perf_counter() - tic


class PeakRSS:
    """Peak of Σ RSS over this process (and its children) sampled by a background thread while in the block."""

    def __init__(self, children: bool = True, interval: float = 0.1):
        import psutil

        self._proc = psutil.Process()
        self._children = children
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0

    def sample(self) -> int:
        procs = [self._proc] + (self._proc.children(recursive=True) if self._children else [])
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except Exception:  # a child that exited between listing and reading
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self._interval)

    def __enter__(self) -> "PeakRSS":
        self.peak = self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())

    @property
    def mb(self) -> float:
        return self.peak / 2**20


class Gaps(io.TextIOBase):
    """A tee in front of `stream` that notes when each line (or tqdm refresh) is written: the time to the first and
    the longest stretch without output since `start()` (``stop()`` counts the last stretch up to then)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.start()

    def start(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.first_s, self.longest_s = None, 0.0

    def stop(self) -> dict:
        now = time.perf_counter()
        self.longest_s = max(self.longest_s, now - self.last)
        return {"first_output_s": None if self.first_s is None else round(self.first_s, 2),
                "longest_silence_s": round(self.longest_s, 2)}

    def isatty(self):
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def write(self, s):
        if "\n" in s or "\r" in s:
            now = time.perf_counter()
            if self.first_s is None:
                self.first_s = now - self.t0
            self.longest_s = max(self.longest_s, now - self.last)
            self.last = now
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()


def make_store(path: Path, n: int, J: int, seed: int, test: int = 0) -> dict:
    """Simulate n points (and `test` held-out ones) and write them as a J-site area-partitioned store with its test
    group; timings and peak RSS."""
    from spatialfed.data.simulate import simulate
    from spatialfed.data.store import write_store

    with PeakRSS(children=False) as mem:
        with stopwatch() as simulating:
            sim = simulate(J, n // J, partition="area", beta=0.1, seed=seed, test_size=test, progress=True)
        with stopwatch() as writing:
            write_store(path, sim.parts(), partition=sim.partition, crs=None, covariate_names=sim.covariate_names,
                        truth=sim.truth, test=sim.test, overwrite=True,
                        extra_attrs={"simulation": {"method": sim.method, "seed": seed}})
    simulate_s, ingest_s = simulating.s, writing.s
    say(f"simulated {len(sim.z)} points ({sim.method}) in {simulate_s:.1f} s, wrote {path} in {ingest_s:.1f} s, "
        f"peak {mem.mb:.0f} MB")
    return {"simulate_s": round(simulate_s, 2), "ingest_s": round(ingest_s, 2), "sim_peak_rss_mb": round(mem.mb, 1),
            "truth": sim.truth, "method": sim.method}
