"""In-process BLAS threads: the simulated runtime and the centralized references run in the caller's process, where
small dense problems (n_j of a few hundred) run far slower with many BLAS threads on a busy machine; worker processes
get ``cluster.SINGLE_THREAD_ENV`` instead."""

from __future__ import annotations

_SET_NAMES = ("openblas_set_num_threads", "scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
              "openblas_set_num_threads64_")
_GET_NAMES = ("openblas_get_num_threads", "scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
              "openblas_get_num_threads64_")


def _openblas_handles():
    """(set, get) function pairs of every OpenBLAS library loaded in this process (Linux; empty elsewhere)."""
    import ctypes
    import re

    paths = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                m = re.search(r"(/\S*openblas\S*\.so\S*)", line)
                if m:
                    paths.add(m.group(1))
    except OSError:  # pragma: no cover - not Linux
        return []
    out = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # pragma: no cover
            continue
        setter = next((getattr(lib, n) for n in _SET_NAMES if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GET_NAMES if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            out.append((setter, getter))
    return out


class limit_blas_threads:
    """Context manager holding the OpenBLAS libraries of this process (numpy's and scipy's) to `n` threads.

    Small dense problems (n_j of a few hundred) run far slower with many BLAS threads on a busy machine; worker
    processes get ``SINGLE_THREAD_ENV`` instead. Does nothing where OpenBLAS is not found.
    """

    def __init__(self, n: int = 1):
        self.n = int(n)
        self._saved = []

    def __enter__(self):
        import ctypes

        for setter, getter in _openblas_handles():
            self._saved.append((setter, int(getter())))
            setter(ctypes.c_int(self.n))
        return self

    def __exit__(self, *exc):
        import ctypes

        for setter, old in self._saved:
            setter(ctypes.c_int(old))
        self._saved = []
