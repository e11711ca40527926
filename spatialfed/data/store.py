"""The partitioned Zarr store of SPEC §5: write atomically, open once as a `Store` handle, load one worker's group.

Layout: root attributes `spatialfed_format` (1), `n_workers`, `partition`, `crs`, `covariate_names`,
optional `truth`; groups `workers/<j>` holding `locs` (n_j×2 float64), `z` (n_j), `X` (n_j×p);
optional group `test` with the same arrays. Extra root attributes (e.g. `worker_labels`) are allowed.

Integrity (beyond SPEC §5): every group records `n_rows` and `sha256` (of its three arrays' float64 bytes, see
`checksum`) when written, and the root records `fingerprint` (sha256 over the root attributes and every group's
row count and checksum). Reading a group checks its shape, row count and checksum, so a deleted or corrupted chunk
(which Zarr would read as its fill value, zeros) is refused with the partition named; `open_store` checks the
fingerprint against the groups' records. Stores written before this carry no checksums and no fingerprint: they
load with one warning, and their fingerprint is derived from the metadata ("legacy-sha256:..."); a store whose root
records a fingerprint needs every group's records (stripping them all is refused, not taken for an old store).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import zarr

from spatialfed.atomic import refuse_existing, staged
from spatialfed.data.coords import MAX_ABS_COORD, MAX_ABS_VALUE
from spatialfed.errors import StoreError, option, warn

FORMAT_VERSION = 1
ARRAYS = ("locs", "z", "X")
TRUTH_KEYS = ("gamma", "delta", "sigma2", "beta", "nu")
_PARTITION = re.compile(r"^(random|area|neighbor|column:.+)$")
_CHUNK_ROWS = 262_144


@dataclass(frozen=True)
class Store:
    """An opened, validated store (metadata only, no data arrays read): open it once per command and pass it down.

    Keeps the fields of the former `StoreInfo` (an alias), so `info.path`, `info.sizes`, ... work as before, and
    adds the `fingerprint` (compare it with `outputs.results.check_same_store`), the per-partition `checksums`
    (None for a legacy store) and every root attribute in `attrs`. `load_worker(j)` / `load_test()` read a group
    and check it against the checksum recorded at open, so a store replaced after opening is refused too.
    `os.fspath(store)` is its path: a Store can be passed wherever a store path is expected.
    """

    path: Path
    n_workers: int
    partition: str
    crs: str | None
    covariate_names: list[str]
    truth: dict | None
    sizes: list[int]
    has_test: bool
    fingerprint: str = ""
    checksums: tuple = ()  # sha256 of workers/0..J-1 (None each for a legacy store)
    test_checksum: str | None = None
    attrs: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def p(self) -> int:
        """Number of covariates (columns of X, the intercept included)."""
        return len(self.covariate_names)

    @property
    def n_obs(self) -> int:
        """N = Σ_j n_j over the workers' partitions (the test group excluded)."""
        return int(sum(self.sizes))

    @property
    def verified(self) -> bool:
        """Whether the store records checksums (False: written before integrity records, loads unchecked)."""
        return not self.fingerprint.startswith(LEGACY_PREFIX)

    @property
    def worker_labels(self) -> list | None:
        """The user's group label of each worker (ingest --partition column:NAME), when recorded."""
        return self.attrs.get("worker_labels")

    @cached_property
    def parsed_crs(self):
        """The CRS as a pyproj CRS (parsed once per handle; None for planar units)."""
        from spatialfed.data.geometry import parse_crs  # pyproj is slow to import: only when asked

        return parse_crs(self.crs)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __getstate__(self) -> dict:
        """Pickled (e.g. to Dask workers) without the parsed CRS."""
        return {k: v for k, v in self.__dict__.items() if k != "parsed_crs"}

    def load_worker(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(locs, z, X) of worker j, checked against its row count and checksum (StoreError naming workers/<j>)."""
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < self.n_workers:
            raise StoreError(f"{self.path}: worker index {j!r} out of range; the store has workers "
                             f"0..{self.n_workers - 1}")
        expected = self.checksums[int(j)] if self.checksums else None
        return _load(self.path, f"workers/{int(j)}", self.p, expected=expected)

    def load_test(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(locs, z, X) of the held-out test group, checked like a worker's."""
        if not self.has_test:
            raise StoreError(f"{self.path} has no test group; create it with {_test_option()}")
        return _load(self.path, "test", self.p, expected=self.test_checksum)


#: the former name of `Store` (callers that only read its fields)
StoreInfo = Store

LEGACY_PREFIX = "legacy-"
_WARNED: set[str] = set()


def checksum(locs, z, X) -> str:
    """sha256 of a partition: each array's name, shape and little-endian float64 bytes, in the order locs, z, X."""
    h = hashlib.sha256()
    for name, arr in zip(ARRAYS, (locs, z, X)):
        a = np.ascontiguousarray(arr, dtype="<f8")
        h.update(f"{name}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _fingerprint(attrs: dict, records: list[tuple[str, int, str | None]]) -> str:
    """sha256 over the root attributes (JSON, keys sorted, `fingerprint` left out) and each group's
    (name, n_rows, sha256); legacy stores (no checksums) get "legacy-sha256:..." over the same metadata."""
    doc = {"attrs": {k: v for k, v in attrs.items() if k != "fingerprint"}, "groups": [list(r) for r in records]}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    prefix = LEGACY_PREFIX if any(r[2] is None for r in records) else ""
    return f"{prefix}sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def store_fingerprint(path) -> str:
    """The fingerprint recorded at write time (the root attributes only: cheap); open_store for a checked one."""
    if isinstance(path, Store):
        return path.fingerprint
    fingerprint = _root_attrs(path).get("fingerprint")
    return fingerprint if isinstance(fingerprint, str) else open_store(path).fingerprint


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
    if np.abs(locs).max() > MAX_ABS_COORD:  # no map coordinates (data.coords): the knot layout would never end
        raise StoreError(f"{name}: locs reach {np.abs(locs).max():.3g}, beyond ±{MAX_ABS_COORD:.0e} map units, while "
                         "projected coordinates on Earth stay below 4e7 m; check the coordinates and their units")
    for arr, label in ((z, "z"), (X, "X")):  # a square beyond float64: the sites' moments would overflow
        big = np.argwhere(np.abs(arr.reshape(n, -1)) > MAX_ABS_VALUE)
        if len(big):
            row, col = (int(i) for i in big[0])
            where = f"row {row}" + (f", column {col}" if label == "X" else "")
            raise StoreError(f"{name}: {label} holds {arr.reshape(n, -1)[row, col]:.3g} in {where} (beyond "
                             f"±{MAX_ABS_VALUE:.0e}, whose square overflows float64): an absurd value, e.g. a "
                             "missing-value code; remove that row or rescale the column")
    return locs, z, X


def _write_arrays(group: zarr.Group, part) -> str:
    """Write locs, z and X into a group, chunked by rows, with its `n_rows` and `sha256` attributes; the checksum."""
    for name, arr in zip(ARRAYS, part):
        chunks = (min(len(arr), _CHUNK_ROWS),) + arr.shape[1:]
        group.create_array(name, data=np.ascontiguousarray(arr), chunks=chunks)
    digest = checksum(*part)
    group.attrs.update(n_rows=int(len(part[1])), sha256=digest)
    return digest


@contextmanager
def zarr_writes_settled(timeout: float = 30.0):
    """On an exception, wait (up to `timeout` s) for the writes zarr still has in flight before it propagates.

    zarr writes a node's pieces concurrently on its own IO loop; when one fails (a full disk) the call returns at
    once while its siblings run on, and one may create a file after the staged directory was removed. Nest this
    inside `staged` so its cleanup runs only once zarr is idle."""
    try:
        yield
    except BaseException:
        loop = getattr(getattr(zarr.core, "sync", None), "loop", [None])[0]  # zarr's IO loop, once started
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_idle(timeout), loop).result(timeout + 1.0)
            except Exception:  # best effort: the original error is the one to report
                pass
        raise


async def _idle(timeout: float) -> None:
    """Return once every other task on the running loop is done (they await what they start), or after `timeout` s."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=timeout)


def write_store(path, parts, *, partition: str, crs: str | None, covariate_names: list[str], truth: dict | None = None,
                test: tuple | None = None, overwrite: bool = False, extra_attrs: dict | None = None) -> Store:
    """Write parts[j] = (locs, z, X) to groups workers/<j> (and `test`), each with its row count and checksum, and
    the store's fingerprint; staged beside `path`, then renamed into place (atomic.staged). Returns the opened Store."""
    path = Path(path)
    refuse_existing(path, overwrite, error=StoreError)
    if not _PARTITION.match(str(partition)):
        raise StoreError(f"partition {partition!r} must be random, area, neighbor or column:<name>")
    covariate_names = [str(c) for c in covariate_names]
    if len(parts) == 0:
        raise StoreError("a store needs at least one worker's data")
    parts = [check_part(part, len(covariate_names), f"worker {j}") for j, part in enumerate(parts)]
    if crs is not None:  # degrees labelled with a projected CRS (metres): refused, as at ingest
        from spatialfed.data.crs import check_degrees_mislabelled

        locs = np.vstack([part[0] for part in parts])
        check_degrees_mislabelled(locs[:, 0], locs[:, 1], crs, "the coordinates",
                                  fix="project them to metres first (ingest(..., crs='EPSG:4326') does) or give "
                                      "the CRS they are in")
    test = check_part(test, len(covariate_names), "test set") if test is not None else None
    if truth is not None:
        truth = _check_truth(truth, len(covariate_names))
    attrs = dict(extra_attrs or {})
    attrs.update(spatialfed_format=FORMAT_VERSION, n_workers=len(parts), partition=str(partition), crs=crs,
                 covariate_names=covariate_names)
    if truth is not None:
        attrs["truth"] = truth
    with staged(path, directory=True) as tmp, zarr_writes_settled():
        root = zarr.open_group(tmp, mode="w")
        workers = root.create_group("workers")
        records = [(f"workers/{j}", len(part[1]), _write_arrays(workers.create_group(str(j)), part))
                   for j, part in enumerate(parts)]
        if test is not None:
            records.append(("test", len(test[1]), _write_arrays(root.create_group("test"), test)))
        root.attrs.update(attrs)
        root.attrs["fingerprint"] = _fingerprint(dict(root.attrs), records)  # over the attributes as read back
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
    except ValueError as exc:  # its zarr.json is not JSON (truncated, edited)
        raise _bad_metadata(path, exc) from None
    except Exception as exc:  # zarr raises several types for unreadable metadata
        raise StoreError(f"cannot open {path} as a Zarr group: {exc}") from None


def _bad_metadata(path: Path, exc: Exception) -> StoreError:
    """The StoreError naming the store's first metadata file (zarr.json) that is not valid JSON."""
    import json

    for meta in sorted(path.rglob("zarr.json")):
        try:
            json.loads(meta.read_bytes())
        except (OSError, ValueError) as bad:
            return StoreError(f"{meta} is not valid JSON ({bad}): the store's metadata is truncated or damaged; "
                              f"{fix()}")
    return StoreError(f"cannot read the metadata of {path} ({exc}); {fix()}")


def _test_option() -> str:
    """How to give a store a test group, in the caller's spelling."""
    return option("test_size= (simulate_store) or test_fraction= (ingest)",
                  "--test-size (simulate) or --test-fraction (ingest)")


def fix() -> str:
    """How to repair a damaged store, in the caller's spelling (spatialfed.errors.option)."""
    rewrite = option("ingest(..., overwrite=True) or simulate_store(..., overwrite=True)",
                     "spatialfed ingest/simulate ... --overwrite")
    return f"re-ingest the data ({rewrite}) or restore the store from a backup"


def _group(path: Path, where: str, p: int) -> tuple[zarr.Group, int, str | None]:
    """Open group `where` and check its arrays' shapes and dtypes (metadata only) and its recorded row count;
    returns (group, n_rows, recorded sha256 or None for a store written before checksums)."""
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
        except ValueError as exc:  # the array's zarr.json is not JSON (truncated, edited)
            raise _bad_metadata(Path(path), exc) from None
        if not isinstance(arr, zarr.Array):
            raise StoreError(f"{path}: '{where}/{name}' must be an array, found a group")
        shapes[name] = (arr.shape, arr.dtype)
    if len(shapes["z"][0]) != 1:  # no row count to check locs and X against
        raise StoreError(f"{path}: '{where}/z' has shape {shapes['z'][0]}, expected (n,), one value per row; {fix()}")
    n = shapes["z"][0][0]
    expected = {"locs": (n, 2), "z": (n,), "X": (n, p)}
    for name in ARRAYS:
        shape, dtype = shapes[name]
        if n < 1 or shape != expected[name]:
            raise StoreError(f"{path}: '{where}/{name}' has shape {shape}, expected {expected[name]} "
                             f"(n = rows of z, p = {p} covariate names)")
        if not np.issubdtype(dtype, np.floating):
            raise StoreError(f"{path}: '{where}/{name}' has dtype {dtype}, expected float64")
    attrs = dict(group.attrs)
    if "sha256" not in attrs and "n_rows" not in attrs:
        return group, int(n), None
    rows, digest = attrs.get("n_rows"), attrs.get("sha256")
    if not isinstance(digest, str) or not isinstance(rows, int) or isinstance(rows, bool):
        raise StoreError(f"{path}: partition {where} has malformed integrity records (n_rows={rows!r}, "
                         f"sha256={digest!r}); {fix()}")
    if rows != n:
        raise StoreError(f"{path}: partition {where} holds {n} rows but {rows} were written; {fix()}")
    return group, int(n), digest


def _warn_legacy(path: Path) -> None:
    """Warn once per store (per process) that it carries no checksums."""
    key = os.path.realpath(path)
    if key not in _WARNED:
        _WARNED.add(key)
        warn(f"{path} was written before stores recorded checksums: a damaged partition cannot be "
             "detected; write it again with this version ("
             + option("ingest/simulate_store(..., overwrite=True)",
                      "spatialfed ingest/simulate ... --overwrite") + ")")


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


def open_store(path) -> Store:
    """Validate the whole layout of a store (metadata only) and return its `Store` handle; StoreError says what is
    wrong. The recorded fingerprint is checked against the root attributes and every group's records. A Store
    passed in is returned as is (open once, pass the handle down)."""
    if isinstance(path, Store):
        return path
    path = Path(path)
    attrs = _root_attrs(path)
    root = _open_root(path)
    raw = dict(root.attrs)
    p = len(attrs["covariate_names"])
    try:
        groups = sorted(root["workers"].group_keys(), key=lambda g: (len(g), g))
    except KeyError:
        raise StoreError(f"{path}: group 'workers' is missing") from None
    except ValueError as exc:  # a child's zarr.json that is not JSON (truncated, edited)
        raise _bad_metadata(path, exc) from None
    expected = [str(j) for j in range(attrs["n_workers"])]
    if set(groups) != set(expected):
        raise StoreError(f"{path}: workers/ holds groups {groups}, expected exactly 0..{attrs['n_workers'] - 1}")
    records = [(f"workers/{j}",) + _group(path, f"workers/{j}", p)[1:] for j in range(attrs["n_workers"])]
    has_test = "test" in set(root.group_keys())
    if has_test:
        records.append(("test",) + _group(path, "test", p)[1:])
    missing = [where for where, _, digest in records if digest is None]
    computed = _fingerprint(raw, records)
    if missing and len(missing) < len(records):
        raise StoreError(f"{path}: partitions {missing} have no integrity records while the others do (mixed from "
                         f"another store?); {fix()}")
    if missing and isinstance(raw.get("fingerprint"), str):  # only a store with no fingerprint at all is old
        raise StoreError(f"{path}: every partition's integrity records (n_rows, sha256) are missing, but the root "
                         "records a fingerprint: they were removed after the store was written; " + fix())
    if missing:
        _warn_legacy(path)
    elif raw.get("fingerprint") != computed:
        raise StoreError(f"{path}: the recorded fingerprint does not match the store's partitions and attributes "
                         f"(modified after it was written: a partition or attribute replaced); {fix()}")
    digests = [digest for _, _, digest in records]
    return Store(path=path, n_workers=attrs["n_workers"], partition=attrs["partition"], crs=attrs["crs"],
                 covariate_names=list(attrs["covariate_names"]), truth=attrs.get("truth"),
                 sizes=[n for _, n, _ in records[:attrs["n_workers"]]], has_test=has_test, fingerprint=computed,
                 checksums=tuple(digests[:attrs["n_workers"]]), test_checksum=digests[-1] if has_test else None,
                 attrs=attrs)


def _load(path: Path, where: str, p: int, expected: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read locs, z, X of one group as float64 arrays, checked against the group's recorded row count and checksum
    (and `expected`, the checksum the Store handle saw at open)."""
    group, _, digest = _group(path, where, p)
    if expected is not None and digest != expected:
        raise StoreError(f"{path}: partition {where} changed since the store was opened (rewritten during the run?); "
                         "open the store again and restart the command")
    try:
        arrays = tuple(np.asarray(group[name][...], dtype=np.float64) for name in ARRAYS)
    except Exception as exc:  # codec and I/O errors come in many types
        raise StoreError(f"{path}: cannot read partition {where} ({type(exc).__name__}: {exc}): the store is "
                         f"damaged; {fix()}") from None
    if digest is None:
        _warn_legacy(path)
    elif checksum(*arrays) != digest:
        raise StoreError(f"{path}: partition {where} is damaged: its data do not match the checksum recorded when "
                         f"the store was written (a chunk file deleted or corrupted); {fix()}")
    return arrays


def load_worker(path, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(locs, z, X) of worker j, reading the root attributes and group workers/<j> only (checked against its row
    count and checksum). `path` may be a Store (then `Store.load_worker`)."""
    if isinstance(path, Store):
        return path.load_worker(j)
    path = Path(path)
    attrs = _root_attrs(path)
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < attrs["n_workers"]:
        raise StoreError(f"{path}: worker index {j!r} out of range; the store has workers 0..{attrs['n_workers'] - 1}")
    return _load(path, f"workers/{int(j)}", len(attrs["covariate_names"]))


def load_test(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(locs, z, X) of the held-out test group (checked like a worker's). `path` may be a Store."""
    if isinstance(path, Store):
        return path.load_test()
    path = Path(path)
    attrs = _root_attrs(path)
    if not (path / "test" / "zarr.json").is_file():
        raise StoreError(f"{path} has no test group; create it with {_test_option()}")
    return _load(path, "test", len(attrs["covariate_names"]))
