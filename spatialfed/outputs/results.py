"""Result files of a fit (SPEC §6): ``fit.json``, ``model.zarr``, ``trace.csv``, written atomically; and readers.

``fit.json`` carries exactly the keys of SPEC §6::

    {"method", "mode", "residual", "nu", "n_workers", "n_obs",
     "params": {"gamma": [..], "delta", "sigma2", "beta"},
     "loglik", "knots": [[x, y], ..], "iterations", "wall_time_s", "converged",
     "trace": [{"iter", "time_s", "step", "delta", "sigma2", "beta", "gamma": [..], "max_staleness"}, ..]}

``model.zarr`` holds arrays ``mu`` (m), ``Sigma`` (m×m), ``knots`` (m×2), ``gamma`` (p) and, as attributes, the
parameters and fit settings. ``trace.csv`` is the trace as a table (``gamma`` expanded to ``gamma_0 .. gamma_{p-1}``)
with one more column, ``loglik``, where the server recorded one (theta rows: estimate; final row: exact ℓ).

Writes go to a temporary directory beside the target and are moved into place at the end, ``fit.json`` last
(spatialfed.atomic), so a reader never sees a half-written result: a directory with ``fit.json`` in it is complete.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spatialfed.atomic import staged_entries
from spatialfed.data.store import zarr_writes_settled
from spatialfed.errors import OutputError, StoreError, option, warn
from spatialfed.model.residuals import may_be_vecchia

FIT_JSON = "fit.json"
MODEL_ZARR = "model.zarr"
TRACE_CSV = "trace.csv"

FIT_KEYS = (
    "method", "mode", "residual", "nu", "n_workers", "n_obs", "params", "loglik", "knots",
    "iterations", "wall_time_s", "converged", "trace",
)
PARAM_KEYS = ("gamma", "delta", "sigma2", "beta")
TRACE_KEYS = ("iter", "time_s", "step", "delta", "sigma2", "beta", "gamma", "max_staleness")


@dataclass
class FitResult:
    """Everything a fit produces; ``to_json()`` gives the ``fit.json`` document of SPEC §6."""

    method: str
    mode: str
    residual: str
    nu: float
    n_workers: int
    n_obs: int
    params: dict            # {"gamma": [..], "delta": float, "sigma2": float, "beta": float}
    loglik: float | None
    knots: np.ndarray       # (m, 2)
    iterations: int
    wall_time_s: float
    converged: bool
    trace: list = field(default_factory=list)   # list of dicts with TRACE_KEYS
    mu: np.ndarray | None = None                # (m,)
    Sigma: np.ndarray | None = None             # (m, m)
    extra: dict = field(default_factory=dict)   # settings stored as model.zarr attributes (not in fit.json)
    dropped_workers: list = field(default_factory=list)  # workers the fit continued without (fit.json, when any)
    privacy: dict | None = None  # privacy loss of a fit with the Gaussian mechanism (fit.json, when on)
    store_fingerprint: str | None = None  # data.store.Store.fingerprint of the store fitted (fit.json, when known)

    def to_json(self) -> dict:
        doc = {
            "method": str(self.method),
            "mode": str(self.mode),
            "residual": str(self.residual),
            "nu": float(self.nu),
            "n_workers": int(self.n_workers),
            "n_obs": int(self.n_obs),
            "params": _params_json(self.params),
            "loglik": _num(self.loglik),
            "knots": np.asarray(self.knots, dtype=float).reshape(-1, 2).tolist(),
            "iterations": int(self.iterations),
            "wall_time_s": float(self.wall_time_s),
            "converged": bool(self.converged),
            "trace": [_trace_row_json(r) for r in self.trace],
        }
        assert tuple(doc) == FIT_KEYS
        if self.dropped_workers:  # beyond SPEC §6: only present when the fit continued without a failed worker
            doc["dropped_workers"] = [dict(d) for d in self.dropped_workers]
        if self.privacy is not None:  # beyond SPEC §6: μ-GDP and (ε, δ) of a fit with privacy noise (docs/privacy.md)
            doc["privacy"] = self.privacy
        if self.store_fingerprint is not None:  # beyond SPEC §6: predict/map/--resume refuse another store
            doc["store_fingerprint"] = str(self.store_fingerprint)
        if (self.extra or {}).get("variogram_params"):  # beyond SPEC §6: nugget, sills, ranges in CRS units (api.units)
            doc["variogram_params"] = dict(self.extra["variogram_params"])
        if (self.extra or {}).get("boundary"):  # beyond SPEC §6: parameters left on a bound, e.g. {"delta": "upper"}
            doc["boundary"] = dict(self.extra["boundary"])
        if may_be_vecchia(self.residual) and (self.extra or {}).get("vecchia_k"):  # beyond SPEC §6 (§2c)
            doc["vecchia_k"] = int(self.extra["vecchia_k"])
        if (self.extra or {}).get("site_blocked_cv"):  # beyond SPEC §6: the site-blocked CV score (api/blocked_cv.py)
            doc["site_blocked_cv"] = dict(self.extra["site_blocked_cv"])
        return doc


def _num(x):
    """A JSON-safe float: None for missing or non-finite values (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _params_json(params) -> dict:
    missing = [k for k in PARAM_KEYS if k not in params]
    if missing:
        raise ValueError(f"params is missing {missing}; expected keys {list(PARAM_KEYS)}")
    return {
        "gamma": [float(g) for g in np.ravel(params["gamma"])],
        "delta": float(params["delta"]),
        "sigma2": float(params["sigma2"]),
        "beta": float(params["beta"]),
    }


def _trace_row_json(row) -> dict:
    missing = [k for k in TRACE_KEYS if k not in row]
    if missing:
        raise ValueError(f"trace row is missing {missing}; expected keys {list(TRACE_KEYS)}")
    return {
        "iter": int(row["iter"]),
        "time_s": float(row["time_s"]),
        "step": str(row["step"]),
        "delta": _num(row["delta"]),
        "sigma2": _num(row["sigma2"]),
        "beta": _num(row["beta"]),
        "gamma": [_num(g) for g in np.ravel(row["gamma"])],
        "max_staleness": int(row["max_staleness"]),
    }


def _attr_safe(obj):
    """Convert numpy scalars/arrays (recursively) into JSON-native values for Zarr attributes."""
    if isinstance(obj, dict):
        return {str(k): _attr_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_attr_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _attr_safe(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _num(obj)
    return obj


def _write_trace_csv(path: Path, trace: list, p: int) -> None:
    """The trace as a table: SPEC's trace keys with gamma spread over gamma_0..gamma_{p-1}, then `loglik` (the
    server's ℓ estimate on theta rows and the exact ℓ on the final row; empty elsewhere)."""
    cols = ["iter", "time_s", "step", "delta", "sigma2", "beta"] + [f"gamma_{i}" for i in range(p)]
    cols += ["max_staleness", "loglik"]
    fmt = lambda v: "" if v is None else repr(v)  # noqa: E731
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for raw in trace:
            r = _trace_row_json(raw)
            g = list(r["gamma"]) + [None] * (p - len(r["gamma"]))
            vals = [r["iter"], fmt(r["time_s"]), r["step"], fmt(r["delta"]), fmt(r["sigma2"]), fmt(r["beta"])]
            vals += [fmt(v) for v in g[:p]] + [r["max_staleness"], fmt(_num(raw.get("loglik")))]
            w.writerow(vals)


def _write_model_zarr(path: Path, result: FitResult) -> None:
    import zarr

    g = zarr.open_group(str(path), mode="w")
    knots = np.asarray(result.knots, dtype=float).reshape(-1, 2)
    g.create_array("knots", data=knots)
    if result.mu is not None:
        g.create_array("mu", data=np.asarray(result.mu, dtype=float))
    if result.Sigma is not None:
        g.create_array("Sigma", data=np.asarray(result.Sigma, dtype=float))
    g.create_array("gamma", data=np.asarray(result.params["gamma"], dtype=float).ravel())
    g.attrs.update(_attr_safe({
        "spatialfed_result": 1,
        "method": result.method,
        "mode": result.mode,
        "residual": result.residual,
        "nu": result.nu,
        "n_workers": result.n_workers,
        "n_obs": result.n_obs,
        "params": _params_json(result.params),
        "loglik": result.loglik,
        "iterations": result.iterations,
        "converged": result.converged,
        "settings": result.extra,
        "store_fingerprint": result.store_fingerprint,
    }))


def write_results(out_dir, result: FitResult, *, extras: dict | None = None) -> Path:
    """Write fit.json, model.zarr and trace.csv (and `extras`) into ``out_dir`` atomically; returns the directory.

    `extras` maps a file name to a function writing that file at the path it is given, e.g.
    ``{"report.html": monitor.write_report}``: those files join the same atomic set. Everything is built in a
    temporary sibling directory (`atomic.staged_entries`); a new ``out_dir`` is renamed into place whole, an existing
    one gets its old ``fit.json`` removed, the new pieces moved in and ``fit.json`` last. Other files already in
    ``out_dir`` (a checkpoint, your notes) are left alone. OS errors are one OutputError line.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"cannot write results to {out}: it exists and is a file, not a directory; choose another "
                          f"{option('out_dir', '--out')}")
    doc = result.to_json()
    text = json.dumps(doc, indent=1, allow_nan=False)
    with staged_entries(out, last=(FIT_JSON,)) as tmp:
        _write_trace_csv(tmp / TRACE_CSV, result.trace, len(doc["params"]["gamma"]))
        with zarr_writes_settled():
            _write_model_zarr(tmp / MODEL_ZARR, result)
        for name, write in (extras or {}).items():
            if Path(name).name != name or name in (FIT_JSON, TRACE_CSV, MODEL_ZARR):
                raise ValueError(f"extra result file {name!r} must be a plain file name other than the result files")
            write(tmp / name)
        (tmp / FIT_JSON).write_text(text + "\n")
    return out


def load_fit(out_dir) -> FitResult:
    """Read a fit directory written by ``write_results`` (or ``spatialfed fit``) back into a FitResult."""
    d = Path(out_dir)
    fj = d / FIT_JSON
    if not fj.exists():
        raise FileNotFoundError(f"{fj} not found: {d} is not a (complete) spatialfed fit directory")
    try:
        doc = json.loads(fj.read_text())
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{fj} is not valid JSON ({exc}): the fit directory is damaged; run the fit again") from None
    missing = [k for k in FIT_KEYS if k not in doc]
    if missing:
        raise ValueError(f"{fj} lacks keys {missing}: it was not written by spatialfed, or is damaged; run the "
                         "fit again")
    mu = Sigma = None
    extra = {}
    mz = d / MODEL_ZARR
    if mz.exists():
        import zarr

        g = zarr.open_group(str(mz), mode="r")
        if "mu" in g:
            mu = np.asarray(g["mu"][:])
        if "Sigma" in g:
            Sigma = np.asarray(g["Sigma"][:])
        extra = dict(g.attrs.get("settings", {}) or {})
        _check_consistent(fj, doc, g)
    return FitResult(
        method=doc["method"], mode=doc["mode"], residual=doc["residual"], nu=doc["nu"],
        n_workers=doc["n_workers"], n_obs=doc["n_obs"], params=doc["params"],
        loglik=doc["loglik"], knots=np.asarray(doc["knots"], dtype=float).reshape(-1, 2),
        iterations=doc["iterations"], wall_time_s=doc["wall_time_s"], converged=doc["converged"],
        trace=doc["trace"], mu=mu, Sigma=Sigma, extra=extra, dropped_workers=doc.get("dropped_workers", []),
        privacy=doc.get("privacy"), store_fingerprint=doc.get("store_fingerprint"),
    )


#: fit.json entries model.zarr records too, as attributes (the arrays knots and gamma are compared as well)
CROSS_CHECKED = ("method", "mode", "residual", "nu", "n_workers", "n_obs", "params", "loglik", "iterations",
                 "converged")


def _check_consistent(fit_json: Path, doc: dict, group) -> None:
    """Refuse a fit.json that no longer matches its model.zarr (edited by hand after the fit: a changed ν, knots,
    J or parameter would predict with exit 0 and silently wrong numbers); both are written from one FitResult, so
    every value is equal bit for bit."""
    attrs = dict(group.attrs)
    if attrs.get("spatialfed_result") != 1:
        return  # not a model.zarr this module wrote
    differ = [k for k in CROSS_CHECKED if k in attrs and not _same_value(doc.get(k), attrs[k])]
    for name, value in (("knots", doc.get("knots")), ("params.gamma", (doc.get("params") or {}).get("gamma"))):
        stored = group[name.split(".")[-1]][:] if name.split(".")[-1] in group else None
        if stored is not None and not _same_array(value, stored):
            differ.append(name)
    if differ:
        raise ValueError(f"{fit_json} does not match {fit_json.parent / MODEL_ZARR} in {', '.join(differ)}: the fit "
                         "directory was edited after the fit wrote it; run the fit again (or restore the directory)")


def _same_value(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) or isinstance(b, list):
        return _same_array(a, b)
    return a == b or (a is None and b is None)


def _same_array(a, b) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel(),
                                   equal_nan=True))
    except (TypeError, ValueError):
        return False


def load_trace_csv(out_dir) -> list[dict]:
    """Read ``trace.csv`` as a list of dicts (numbers parsed, gamma columns gathered into a list)."""
    rows = []
    with open(Path(out_dir) / TRACE_CSV, newline="") as fh:
        for r in csv.DictReader(fh):
            gam = [_f(r[k]) for k in sorted(
                (k for k in r if k.startswith("gamma_")), key=lambda s: int(s.split("_")[1]))]
            rows.append({
                "iter": int(r["iter"]), "time_s": float(r["time_s"]), "step": r["step"],
                "delta": _f(r["delta"]), "sigma2": _f(r["sigma2"]), "beta": _f(r["beta"]),
                "gamma": gam, "max_staleness": int(r["max_staleness"]),
                "loglik": _f(r.get("loglik") or ""),
            })
    return rows


def _f(text: str) -> float:
    return float(text) if text else float("nan")


def check_same_store(recorded_fingerprint, store, *, recorded_store=None, what: str = "the fit",
                     cli_store: str = "--store {}") -> None:
    """Refuse to use `store` with a fit (or checkpoint) made on another store: StoreError naming both.

    `recorded_fingerprint` is the fit's `store_fingerprint` (a FitResult is accepted: its fingerprint and
    `extra["store"]` are used); `store` a Store or a store path (opened here); `recorded_store` the path the fit
    was made on, when known, for the message (`cli_store`: how the command line passes it). A fit without a
    recorded fingerprint (written before fingerprints) cannot be checked: a warning says so and the call returns.
    """
    from spatialfed.data.store import open_store

    if isinstance(recorded_fingerprint, FitResult):
        recorded_store = recorded_store or (recorded_fingerprint.extra or {}).get("store")
        recorded_fingerprint = recorded_fingerprint.store_fingerprint
    store = open_store(store)
    if recorded_fingerprint is None:
        
        warn(f"{what} records no store fingerprint (written by an older spatialfed): cannot check that "
             f"{store.path} is the store it was made on")
        return
    if str(recorded_fingerprint) == store.fingerprint:
        return
    short = lambda f: str(f).split(":")[-1][:12]  # noqa: E731
    made_on = f"store {recorded_store} (fingerprint {short(recorded_fingerprint)})" if recorded_store else \
        f"the store with fingerprint {short(recorded_fingerprint)}"
    hint = ""
    if str(recorded_fingerprint).startswith("legacy-") != store.fingerprint.startswith("legacy-"):
        hint = " (one of them was written before stores recorded checksums: if the data are the same, fit again)"
    use = f"pass {option(f'store={str(recorded_store)!r}', cli_store.format(recorded_store))}" if recorded_store else \
        "pass the store the fit was made on"
    raise StoreError(f"{what} was made on {made_on}, but {store.path} is a different store (fingerprint "
                     f"{short(store.fingerprint)}){hint}; {use}, or fit again on {store.path}")
