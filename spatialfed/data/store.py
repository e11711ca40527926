"""The partitioned Zarr store of SPEC §5: write atomically, open and validate, load one worker's group.

Layout: root attributes `spatialfed_format` (1), `n_workers`, `partition`, `crs`, `covariate_names`,
optional `truth`; groups `workers/<j>` holding `locs` (n_j×2 float64), `z` (n_j), `X` (n_j×p);
optional group `test` with the same arrays. Extra root attributes (e.g. `worker_labels`) are allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from spatialfed.atomic import staged
from spatialfed.errors import StoreError

FORMAT_VERSION = 1
ARRAYS = ("locs", "z", "X")
TRUTH_KEYS = ("gamma", "delta", "sigma2", "beta", "nu")
_PARTITION = re.compile(r"^(random|area|neighbor|column:.+)$")
_CHUNK_ROWS = 262_144


@dataclass(frozen=True)
class StoreInfo:
    """What a valid store holds (read from metadata only, no data arrays)."""

    path: Path
    n_workers: int
    partition: str
    crs: str | None
    covariate_names: list[str]
    truth: dict | None
    sizes: list[int]
    has_test: bool


def check_part(part, p: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate one (locs, z, X) triple: shapes n×2, n, n×p, finite float64, n ≥ 1."""
    if not isinstance(part, (tuple, list)) or len(part) != 3:
        raise StoreError(f"{name} must be a (locs, z, X) triple")
    locs, z, X = (np.asarray(a, dtype=np.float64) for a in part)
    n = len(z)
    if z.ndim != 1 or n == 0:
        raise StoreError(f"{name}: z must be a non-empty 1-D array, got shape {z.shape}")
    if locs.shape != (n, 2):
        raise StoreError(f"{name}: locs must have shape ({n}, 2), got {locs.shape}")
    if X.shape != (n, p):
        raise StoreError(f"{name}: X must have shape ({n}, {p}) (one column per covariate name), got {X.shape}")
    for arr, label in ((locs, "locs"), (z, "z"), (X, "X")):
        if not np.all(np.isfinite(arr)):
            raise StoreError(f"{name}: {label} holds NaN or infinite values; drop or impute those rows first")
    return locs, z, X


def _write_arrays(group: zarr.Group, part) -> None:
    """Write locs, z and X into a group, chunked by rows."""
    for name, arr in zip(ARRAYS, part):
        chunks = (min(len(arr), _CHUNK_ROWS),) + arr.shape[1:]
        group.create_array(name, data=np.ascontiguousarray(arr), chunks=chunks)


def write_store(path, parts, *, partition: str, crs: str | None, covariate_names: list[str], truth: dict | None = None,
                test: tuple | None = None, overwrite: bool = False, extra_attrs: dict | None = None) -> StoreInfo:
    """Write parts[j] = (locs, z, X) to groups workers/<j>; staged beside `path`, then renamed into place (atomic.staged)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise StoreError(f"{path} already exists; choose another path or pass overwrite=True (--overwrite)")
    if not _PARTITION.match(str(partition)):
        raise StoreError(f"partition {partition!r} must be random, area, neighbor or column:<name>")
    covariate_names = [str(c) for c in covariate_names]
    if len(parts) == 0:
        raise StoreError("a store needs at least one worker's data")
    parts = [check_part(part, len(covariate_names), f"worker {j}") for j, part in enumerate(parts)]
    test = check_part(test, len(covariate_names), "test set") if test is not None else None
    if truth is not None:
        truth = _check_truth(truth, len(covariate_names))
    attrs = dict(extra_attrs or {})
    attrs.update(spatialfed_format=FORMAT_VERSION, n_workers=len(parts), partition=str(partition), crs=crs,
                 covariate_names=covariate_names)
    if truth is not None:
        attrs["truth"] = truth
    with staged(path, directory=True) as tmp:
        root = zarr.open_group(tmp, mode="w")
        workers = root.create_group("workers")
        for j, part in enumerate(parts):
            _write_arrays(workers.create_group(str(j)), part)
        if test is not None:
            _write_arrays(root.create_group("test"), test)
        root.attrs.update(attrs)
    return open_store(path)


def _check_truth(truth: dict, p: int) -> dict:
    """Validate a truth dict: gamma (p numbers) and positive delta, sigma2, beta, nu."""
    missing = [k for k in TRUTH_KEYS if k not in truth]
    if missing:
        raise StoreError(f"truth is missing {missing}; it needs {list(TRUTH_KEYS)}")
    out = dict(truth)
    out["gamma"] = [float(g) for g in truth["gamma"]]
    if len(out["gamma"]) != p:
        raise StoreError(f"truth gamma has {len(out['gamma'])} entries but there are {p} covariates")
    for key in TRUTH_KEYS[1:]:
        out[key] = float(truth[key])
        if not out[key] > 0:
            raise StoreError(f"truth {key} must be > 0, got {truth[key]!r}")
    return out


def _open_root(path) -> zarr.Group:
    """Open the store's root group read-only (no consolidated metadata) or raise StoreError."""
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise StoreError(f"{path} is not a Zarr v3 store (no zarr.json); create it with `spatialfed simulate` or "
                         "`spatialfed ingest`")
    try:
        return zarr.open_group(path, mode="r", use_consolidated=False)
    except Exception as exc:  # zarr raises several types for unreadable metadata
        raise StoreError(f"cannot open {path} as a Zarr group: {exc}") from None


def _array_shapes(path: Path, where: str, p: int) -> int:
    """Check the three arrays of group `where` (metadata only) and return its row count."""
    try:
        group = zarr.open_group(path, path=where, mode="r", use_consolidated=False)
    except Exception:
        raise StoreError(f"{path}: group '{where}' is missing or unreadable") from None
    shapes = {}
    for name in ARRAYS:
        try:
            arr = group[name]
        except KeyError:
            raise StoreError(f"{path}: group '{where}' has no array '{name}' (needs locs, z, X)") from None
        if not isinstance(arr, zarr.Array):
            raise StoreError(f"{path}: '{where}/{name}' must be an array, found a group")
        shapes[name] = (arr.shape, arr.dtype)
    n = shapes["z"][0][0] if len(shapes["z"][0]) == 1 else -1
    expected = {"locs": (n, 2), "z": (n,), "X": (n, p)}
    for name in ARRAYS:
        shape, dtype = shapes[name]
        if n < 1 or shape != expected[name]:
            raise StoreError(f"{path}: '{where}/{name}' has shape {shape}, expected {expected[name]} "
                             f"(n = rows of z, p = {p} covariate names)")
        if not np.issubdtype(dtype, np.floating):
            raise StoreError(f"{path}: '{where}/{name}' has dtype {dtype}, expected float64")
    return int(n)


def _root_attrs(path) -> dict:
    """Root attributes, validated against SPEC §5."""
    attrs = dict(_open_root(path).attrs)
    if attrs.get("spatialfed_format") != FORMAT_VERSION:
        raise StoreError(f"{path}: root attribute spatialfed_format is {attrs.get('spatialfed_format')!r}, "
                         f"expected {FORMAT_VERSION}; is this a spatialfed store?")
    for key in ("n_workers", "partition", "crs", "covariate_names"):
        if key not in attrs:
            raise StoreError(f"{path}: root attribute '{key}' is missing (SPEC §5)")
    n_workers = attrs["n_workers"]
    if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1:
        raise StoreError(f"{path}: n_workers must be a positive integer, got {n_workers!r}")
    if not isinstance(attrs["partition"], str) or not _PARTITION.match(attrs["partition"]):
        raise StoreError(f"{path}: partition {attrs['partition']!r} is not random, area, neighbor or column:<name>")
    if attrs["crs"] is not None and not isinstance(attrs["crs"], str):
        raise StoreError(f"{path}: crs must be a string such as 'EPSG:28992' or null, got {attrs['crs']!r}")
    names = attrs["covariate_names"]
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        raise StoreError(f"{path}: covariate_names must be a non-empty list of strings, got {names!r}")
    if attrs.get("truth") is not None:
        attrs["truth"] = _check_truth(attrs["truth"], len(names))
    return attrs


def open_store(path) -> StoreInfo:
    """Validate the whole layout of a store (metadata only) and describe it; StoreError says what is wrong."""
    path = Path(path)
    attrs = _root_attrs(path)
    root = _open_root(path)
    p = len(attrs["covariate_names"])
    try:
        groups = sorted(root["workers"].group_keys(), key=lambda g: (len(g), g))
    except KeyError:
        raise StoreError(f"{path}: group 'workers' is missing") from None
    expected = [str(j) for j in range(attrs["n_workers"])]
    if set(groups) != set(expected):
        raise StoreError(f"{path}: workers/ holds groups {groups}, expected exactly 0..{attrs['n_workers'] - 1}")
    sizes = [_array_shapes(path, f"workers/{j}", p) for j in range(attrs["n_workers"])]
    has_test = "test" in set(root.group_keys())
    if has_test:
        _array_shapes(path, "test", p)
    return StoreInfo(path=path, n_workers=attrs["n_workers"], partition=attrs["partition"], crs=attrs["crs"],
                     covariate_names=list(attrs["covariate_names"]), truth=attrs.get("truth"), sizes=sizes,
                     has_test=has_test)


def _load(path: Path, where: str, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read locs, z, X of one group as float64 arrays."""
    _array_shapes(path, where, p)
    group = zarr.open_group(path, path=where, mode="r", use_consolidated=False)
    try:
        return tuple(np.asarray(group[name][...], dtype=np.float64) for name in ARRAYS)
    except Exception as exc:  # codec and I/O errors come in many types
        raise StoreError(f"{path}: cannot read group '{where}' ({exc}); the store is damaged, write it again") from None


def load_worker(path, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(locs, z, X) of worker j, reading the root attributes and group workers/<j> only."""
    path = Path(path)
    attrs = _root_attrs(path)
    if not isinstance(j, (int, np.integer)) or not 0 <= j < attrs["n_workers"]:
        raise StoreError(f"{path}: worker index {j!r} out of range; the store has workers 0..{attrs['n_workers'] - 1}")
    return _load(path, f"workers/{int(j)}", len(attrs["covariate_names"]))


def load_test(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(locs, z, X) of the held-out test group."""
    path = Path(path)
    attrs = _root_attrs(path)
    if not (path / "test" / "zarr.json").is_file():
        raise StoreError(f"{path} has no test group; create it with --test-size (simulate) or --test-fraction (ingest)")
    return _load(path, "test", len(attrs["covariate_names"]))
