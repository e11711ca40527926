"""Checkpoint files of a federated fit: a server snapshot as data (JSON + NumPy arrays), never a pickle.

`write_checkpoint(path, server, meta)` stores `server.snapshot()` (FederatedServer or FgprServer) in one file,
written atomically (spatialfed.atomic: staged beside `path`, fsynced, renamed into place), so `path` always holds
the previous complete checkpoint or the new one. `read_checkpoint(path)` returns the snapshot dict, equal to the
one written (arrays bit for bit, floats exactly, the same types); `FederatedServer.restore(snapshot)` continues
from it (docs/recovery.md).

The file is a ZIP archive (any unzip tool opens it) holding
- `checkpoint.json`: {"magic": "spatialfed-checkpoint", "version": 1, "snapshot": <the snapshot, encoded>}
- `arrays/<key>.npy`: every NumPy array and scalar of the snapshot (`.npy` format, read with allow_pickle=False).

The encoding is explicit: JSON scalars, strings, lists and str-keyed dicts as themselves; the rest tagged —
{"$float": "nan"} (non-finite floats), {"$array": key} (ndarray; {"$scalar": key} a NumPy scalar), {"$tuple": [..]},
{"$dict": [[key, value], ..]} (keys that are not strings, e.g. the (worker, step) keys of ℚ), {"$deque": [..],
"maxlen": n}, {"$set": [..]}, {"$enum": "module:Name", "value": v}, and {"$obj": "module:Name", "id": k,
"state": {..}} for the classes a snapshot holds (Params, Augmented, Quantity, Matern, FitConfig, FgprConfig,
GaussianMechanism, PrivacyAccountant, and any dataclass or Enum of spatialfed.model / spatialfed.algorithm;
{"$ref": k} when the same object appears again, so shared objects stay shared). Reading constructs only those
classes, through their constructors and validation: loading a checkpoint never runs code from the file. Any other
type is refused at write time, naming where it sits in the snapshot.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import zipfile
from collections import deque
from enum import Enum
from pathlib import Path

import numpy as np

from spatialfed.algorithm.config import RETIRED
from spatialfed.atomic import staged
from spatialfed.errors import SpatialFedError

MAGIC = "spatialfed-checkpoint"
VERSION = 1
JSON_MEMBER = "checkpoint.json"
ARRAY_DIR = "arrays/"
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"


class CheckpointError(SpatialFedError, ValueError):
    """A checkpoint file is missing, truncated or not a spatialfed checkpoint."""


#: modules whose dataclasses and enums a snapshot may hold (the sans-IO layers: nothing that runs or connects)
SAFE_MODULES = ("spatialfed.model.", "spatialfed.algorithm.")


def _explicit() -> dict[str, type]:
    """The classes of today's snapshots, by qualified name (imported here: fgpr imports the server, which this module
    must not import at load time). Plain classes (PrivacyAccountant, SiteRecords, Pacing, BoundaryProbe, Pilot) are
    restored by their instance dict."""
    from spatialfed.algorithm.boundary import BoundaryProbe
    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.fgpr import FgprConfig
    from spatialfed.algorithm.pacing import Pacing
    from spatialfed.algorithm.pilot import Pilot
    from spatialfed.algorithm.privacy import GaussianMechanism, PrivacyAccountant
    from spatialfed.algorithm.protocol import Augmented, Quantity
    from spatialfed.algorithm.site_records import SiteRecords
    from spatialfed.model.matern import Matern
    from spatialfed.model.params import Params

    return {_name(cls): cls for cls in (Params, Augmented, Quantity, Matern, FitConfig, FgprConfig,
                                        GaussianMechanism, PrivacyAccountant, SiteRecords, Pacing,
                                        BoundaryProbe, Pilot)}


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _allowed(cls: type, explicit: dict[str, type]) -> bool:
    """A class a checkpoint may hold: listed in `_explicit`, or a dataclass or Enum of a SAFE_MODULES module."""
    if explicit.get(_name(cls)) is cls:
        return True
    return cls.__module__.startswith(SAFE_MODULES) and (dataclasses.is_dataclass(cls) or issubclass(cls, Enum))


def _resolve(name: str, explicit: dict[str, type]) -> type:
    """The class named `module:qualname` in a checkpoint; only `_allowed` classes (CheckpointError otherwise)."""
    cls = explicit.get(name)
    if cls is None:
        module, _, qualname = str(name).partition(":")
        if module.startswith(SAFE_MODULES) and qualname.isidentifier():
            try:
                cls = getattr(importlib.import_module(module), qualname, None)
            except ImportError:
                cls = None
        if not isinstance(cls, type) or not _allowed(cls, explicit):
            raise CheckpointError(f"the checkpoint holds a {name!r}, which this spatialfed does not restore "
                                  "(written by another version?)")
    return cls


# --- encoding ---------------------------------------------------------------------------------------------------
class _Encoder:
    """Snapshot → (JSON document, {key: array}); shared arrays and objects are written once."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self._array_keys: dict[int, str] = {}
        self._objects: dict[int, int] = {}
        self._keep: list = []  # keeps every memoised object alive, so no id() is reused while encoding
        self._explicit = _explicit()
        self._ok: dict[type, bool] = {}

    def encode(self, obj, where: str = "snapshot"):
        if obj is None or type(obj) in (bool, str, int):
            return obj
        if isinstance(obj, Enum):  # before str/int: StrEnum members are strings too
            if not _allowed(type(obj), self._explicit):
                raise TypeError(f"cannot write the enum {type(obj).__module__}.{type(obj).__qualname__} at {where} "
                                "into a checkpoint: only spatialfed.model/algorithm enums are restored")
            return {"$enum": _name(type(obj)), "value": self.encode(obj.value, where)}
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"$float": repr(obj)}
        if isinstance(obj, np.generic):
            return {"$scalar": self._array(np.asarray(obj), where)}
        if type(obj) is np.ndarray:
            return {"$array": self._array(obj, where)}
        if type(obj) is list:
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return {"$tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if type(obj) is dict:
            if all(type(k) is str and not k.startswith("$") for k in obj):
                return {k: self.encode(v, f"{where}[{k!r}]") for k, v in obj.items()}
            return {"$dict": [[self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
        if type(obj) is deque:
            return {"$deque": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)], "maxlen": obj.maxlen}
        if type(obj) in (set, frozenset):
            items = sorted(obj, key=repr)
            return {"$" + type(obj).__name__: [self.encode(v, f"{where} item") for v in items]}
        ok = self._ok.get(type(obj))
        if ok is None:
            ok = self._ok[type(obj)] = _allowed(type(obj), self._explicit)
        if ok:
            return self._object(obj, _name(type(obj)), where)
        raise TypeError(f"cannot write a {type(obj).__module__}.{type(obj).__qualname__} at {where} into a checkpoint: "
                        "add its type to spatialfed.algorithm.checkpoint (checkpoints hold data, never pickles)")

    def _array(self, arr: np.ndarray, where: str) -> str:
        if arr.dtype.hasobject:
            raise TypeError(f"cannot write the object array at {where} into a checkpoint (numbers only)")
        key = self._array_keys.get(id(arr))
        if key is None:
            key = self._array_keys[id(arr)] = f"a{len(self.arrays)}"
            self.arrays[key] = arr
            self._keep.append(arr)
        return key

    def _object(self, obj, name: str, where: str):
        ref = self._objects.get(id(obj))
        if ref is not None:
            return {"$ref": ref}
        ref = self._objects[id(obj)] = len(self._objects)
        self._keep.append(obj)
        if dataclasses.is_dataclass(obj):
            state = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        else:
            state = dict(vars(obj))
        return {"$obj": name, "id": ref, "state": self.encode(state, f"{where}.{name}")}


# --- decoding ---------------------------------------------------------------------------------------------------
class _Decoder:
    """(JSON document, arrays) → snapshot; constructs only the classes `_allowed` admits."""

    def __init__(self, load_array):
        self._load_array = load_array
        self._arrays: dict[str, np.ndarray] = {}
        self._objects: dict[int, object] = {}
        self._explicit = _explicit()

    def decode(self, doc):
        if doc is None or type(doc) in (bool, str, int, float):
            return doc
        if type(doc) is list:
            return [self.decode(v) for v in doc]
        if type(doc) is not dict:
            raise CheckpointError(f"unexpected {type(doc).__name__} in the checkpoint document")
        tags = [k for k in doc if k.startswith("$")]
        if not tags:
            return {k: self.decode(v) for k, v in doc.items()}
        tag = tags[0]
        if tag == "$float":
            return float(doc["$float"])
        if tag == "$array":
            return self._array(doc["$array"])
        if tag == "$scalar":
            return self._array(doc["$scalar"])[()]
        if tag == "$tuple":
            return tuple(self.decode(v) for v in doc["$tuple"])
        if tag == "$dict":
            return {self.decode(k): self.decode(v) for k, v in doc["$dict"]}
        if tag == "$deque":
            return deque((self.decode(v) for v in doc["$deque"]), maxlen=doc.get("maxlen"))
        if tag == "$set":
            return {self.decode(v) for v in doc["$set"]}
        if tag == "$frozenset":
            return frozenset(self.decode(v) for v in doc["$frozenset"])
        if tag == "$ref":
            try:
                return self._objects[doc["$ref"]]
            except KeyError:
                raise CheckpointError(f"reference to object {doc['$ref']!r} before its definition") from None
        if tag == "$obj":
            return self._object(doc)
        if tag == "$enum":
            cls = _resolve(doc["$enum"], self._explicit)
            if not issubclass(cls, Enum):
                raise CheckpointError(f"{doc['$enum']!r} in the checkpoint is not an enum")
            return cls(self.decode(doc["value"]))
        raise CheckpointError(f"unknown tag {tag!r} in the checkpoint document (written by a newer spatialfed?)")

    def _array(self, key: str) -> np.ndarray:
        if key not in self._arrays:
            self._arrays[key] = self._load_array(key)
        return self._arrays[key]

    def _object(self, doc):
        cls = _resolve(doc["$obj"], self._explicit)
        state = self.decode(doc["state"])
        if dataclasses.is_dataclass(cls):
            fields = {f.name: f for f in dataclasses.fields(cls)}
            state = {k: v for k, v in state.items() if k in fields or k not in RETIRED}  # earlier versions' settings
            unknown = sorted(set(state) - set(fields))
            if unknown:
                raise CheckpointError(f"the checkpoint's {cls.__name__} has {unknown}, which this spatialfed does not "
                                      "know (written by another version?)")
            obj = cls(**{k: v for k, v in state.items() if fields[k].init})
            for k, v in state.items():
                if not fields[k].init:
                    object.__setattr__(obj, k, v)
        else:
            obj = cls.__new__(cls)
            vars(obj).update(state)
        self._objects[doc["id"]] = obj
        return obj


def encode_snapshot(snapshot) -> tuple[dict, dict[str, np.ndarray]]:
    """(JSON-ready document, arrays by key) of a snapshot; TypeError naming the place of a type it cannot hold."""
    enc = _Encoder()
    return enc.encode(snapshot), enc.arrays


def decode_snapshot(doc, arrays) -> dict:
    """Inverse of `encode_snapshot` (`arrays`: a mapping key → array)."""
    return _Decoder(arrays.__getitem__).decode(doc)


# --- files ------------------------------------------------------------------------------------------------------
def _write_archive(tmp: Path, text: str, arrays: dict[str, np.ndarray]) -> None:
    """The ZIP archive: checkpoint.json and arrays/<key>.npy (uncompressed: the arrays are floats)."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(JSON_MEMBER, text)
        for key, arr in arrays.items():
            with zf.open(f"{ARRAY_DIR}{key}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(arr), allow_pickle=False)


def write_checkpoint(path, server, meta: dict | None = None) -> Path:
    """Write `server.snapshot()` (or a snapshot dict) to `path` atomically (atomic.staged: temporary sibling,
    fsync, os.replace). `meta`: the runtime's own settings needed to resume (store path, residual, slowdowns, ...),
    kept in the snapshot under "meta" (FederatedServer.restore ignores it). OS errors are one OutputError line."""
    path = Path(path)
    snapshot = server.snapshot() if hasattr(server, "snapshot") else dict(server)
    if meta is not None:
        snapshot["meta"] = dict(meta)
    doc, arrays = encode_snapshot(snapshot)
    text = json.dumps({"magic": MAGIC, "version": VERSION, "snapshot": doc}, separators=(",", ":"), allow_nan=False)
    with staged(path) as tmp:
        _write_archive(tmp, text, arrays)
    return path


def read_checkpoint(path) -> dict:
    """The snapshot dict stored at `path` (CheckpointError naming the file if it is missing, truncated, a pickle
    from an earlier version, or not a checkpoint)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint at {path}") from exc
    except IsADirectoryError as exc:
        raise CheckpointError(f"{path} is a directory, not a checkpoint file") from exc
    if head.startswith(_PICKLE_MAGIC):
        raise CheckpointError(f"{path} is a pickled checkpoint of an earlier spatialfed; pickles are no longer loaded "
                              "(loading one can run code): start the fit again, or resume it with the version that "
                              "wrote it")
    if head != _ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a spatialfed checkpoint")
    try:
        with zipfile.ZipFile(path) as zf:
            try:
                payload = json.loads(zf.read(JSON_MEMBER))
            except KeyError:
                raise CheckpointError(f"{path} is not a spatialfed checkpoint (no {JSON_MEMBER})") from None
            if not isinstance(payload, dict) or payload.get("magic") != MAGIC:
                raise CheckpointError(f"{path} is not a spatialfed checkpoint")
            if payload.get("version") != VERSION:
                raise CheckpointError(f"{path} is a checkpoint of version {payload.get('version')!r}; this "
                                      f"spatialfed reads version {VERSION}")

            def load_array(key: str) -> np.ndarray:
                with zf.open(f"{ARRAY_DIR}{key}.npy") as fh:
                    return np.lib.format.read_array(fh, allow_pickle=False)

            return _Decoder(load_array).decode(payload["snapshot"])
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, TypeError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable spatialfed checkpoint ({type(exc).__name__}: {exc}); "
                              "it may be truncated: use an earlier checkpoint or start the fit again") from exc
