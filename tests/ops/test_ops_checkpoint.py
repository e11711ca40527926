"""Checkpoint and resume of the federated server: snapshot → file → restore continues the fit exactly."""

import dataclasses
import enum
import importlib
import json
import math
import os
import pickle
import pkgutil
import re
import zipfile
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts

import spatialfed
from spatialfed import atomic
from spatialfed.algorithm import checkpoint
from spatialfed.algorithm.checkpoint import (
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.privacy import GaussianMechanism, PrivacyAccountant
from spatialfed.algorithm.protocol import Augmented, Quantity, evaluate
from spatialfed.algorithm.server import _SNAPSHOT_STATE, FederatedServer
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params

J = 3
SPEED = np.array([1.0, 1.0, 1 / 3])  # worker 2 finishes a third as often: stale quantities, real asynchrony


def setup():
    parts = simulate_parts(J=J, n=40, nu=0.5, seed=3)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    server = FederatedServer(J, knots, kernel, FitConfig.of(mode="async", agg_threshold=2, max_iter=8))
    return models, server


def drive(server, models, inflight, i=0, stop=None):
    """Deterministic asynchronous run: at event i one busy worker finishes, drawn by a generator seeded with i
    (weights SPEED), so the event order depends only on i and which workers are busy. Returns the event count."""
    while not server.done and (stop is None or i < stop):
        for j, p in server.dispatch():
            inflight[j] = p
        busy = sorted(inflight)
        w = SPEED[busy]
        j = int(np.random.default_rng([11, i]).choice(busy, p=w / w.sum()))
        p = inflight.pop(j)
        server.receive(evaluate(models[j], p, j), now=0.01 * i)
        i += 1
    return i


@pytest.fixture(scope="module")
def uninterrupted():
    models, server = setup()
    n_events = drive(server, models, {})
    return server, n_events


def assert_same_fit(a, b):
    assert a.done and b.done
    for name in ("mu", "Sigma", "gamma"):
        np.testing.assert_allclose(getattr(b.params, name), getattr(a.params, name), rtol=0, atol=1e-8)
    for name in ("delta", "sigma2", "beta"):
        assert abs(getattr(b.params, name) - getattr(a.params, name)) <= 1e-8
    assert abs(b.loglik - a.loglik) <= 1e-8
    assert (b.iterations, b.converged, b.stop_reason) == (a.iterations, a.converged, a.stop_reason)
    assert [(r["iter"], r["step"], r["time_s"]) for r in b.trace] == [(r["iter"], r["step"], r["time_s"])
                                                                      for r in a.trace]


@pytest.mark.parametrize("k", [1, 4, 17, 30])
def test_resume_from_checkpoint_matches_uninterrupted_run(uninterrupted, tmp_path, k):
    reference, n_events = uninterrupted
    assert k < n_events
    models, server = setup()
    inflight = {}
    i = drive(server, models, inflight, stop=k)
    path = write_checkpoint(tmp_path / "fit.ckpt", server, meta={"store": "sim.zarr", "residual": "full"})
    snap = read_checkpoint(path)
    assert snap["meta"] == {"store": "sim.zarr", "residual": "full"}
    assert snap["resend"].keys() == inflight.keys()  # every task in flight is recorded to be re-sent ...
    for j, p in inflight.items():
        front = snap["buffers"][j][0]  # ... at the front of its worker's buffer
        assert (front.t, front.step) == (p.t, p.step)
        assert (front.params is None) == (p.params is None)
        if p.params is not None:
            np.testing.assert_array_equal(front.params.u, p.params.u)
            np.testing.assert_array_equal(front.params.mu, p.params.mu)
    if k >= 17:
        assert snap["phase"] == "loop" and snap["t"] >= 1 and snap["history"]["theta"]
    del server  # the process "dies": in-flight results are lost with it
    fresh_models = setup()[0]  # new LocalModels: no factorisation cache carried over
    resumed = FederatedServer.restore(snap)
    assert not any(resumed.busy(j) for j in range(J))
    assert drive(resumed, fresh_models, {}, i=i) == n_events
    assert_same_fit(reference, resumed)


def test_snapshot_is_a_deep_copy_and_restores_twice():
    models, server = setup()
    drive(server, models, {}, stop=20)
    snap = server.snapshot()
    a, b = FederatedServer.restore(snap), FederatedServer.restore(snap)
    drive(a, models, {}, i=20)
    assert a.done and not b.done  # b is untouched by a's progress
    assert snap["t"] == b.t and snap["phase"] == "loop"
    assert snap["config"]["agg_threshold"] == 2 and snap["time_s"] == pytest.approx(0.19)


def test_snapshot_covers_every_attribute():
    """A new server attribute must be added to the snapshot (or to this list with a reason)."""
    models, server = setup()
    drive(server, models, {}, stop=20)
    handled = set(_SNAPSHOT_STATE.values()) | {"config", "block", "_P", "_in_flight", "_obsolete", "_history"}
    assert set(vars(server)) <= handled, set(vars(server)) - handled


def test_restore_rejects_foreign_snapshots():
    with pytest.raises(ValueError, match="format"):
        FederatedServer.restore({"format": 99})
    _, server = setup()
    snap = server.snapshot()
    del snap["Q"]
    with pytest.raises(ValueError, match="missing"):
        FederatedServer.restore(snap)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    models, server = setup()
    inflight = {}
    i = drive(server, models, inflight, stop=10)
    path = write_checkpoint(tmp_path / "fit.ckpt", server)
    before = path.read_bytes()
    drive(server, models, inflight, i=i, stop=15)

    def dies_halfway(tmp, text, arrays):
        tmp.write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "_write_archive", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(path, server)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path / "new.ckpt", server)
    assert path.read_bytes() == before  # the previous checkpoint is intact
    assert sorted(os.listdir(tmp_path)) == ["fit.ckpt"]  # no partial new file, no temp files left
    monkeypatch.undo()

    def replace_fails(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(atomic.os, "replace", replace_fails)
    with pytest.raises(OSError, match="rename failed"):
        write_checkpoint(path, server)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["fit.ckpt"]


def test_read_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        read_checkpoint(tmp_path / "missing.ckpt")
    _, server = setup()
    whole = write_checkpoint(tmp_path / "whole.ckpt", server).read_bytes()
    (tmp_path / "trunc.ckpt").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match="not a readable .* truncated"):
        read_checkpoint(tmp_path / "trunc.ckpt")
    (tmp_path / "other.ckpt").write_text('{"a": 1}')
    with pytest.raises(CheckpointError, match="not a spatialfed checkpoint"):
        read_checkpoint(tmp_path / "other.ckpt")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("checkpoint.json", '{"magic": "something else"}')
    with pytest.raises(CheckpointError, match="not a spatialfed checkpoint"):
        read_checkpoint(tmp_path / "other.zip")
    with pytest.raises(CheckpointError, match="is a directory"):
        read_checkpoint(tmp_path)


def test_a_pickled_checkpoint_is_refused_not_loaded(tmp_path):
    """Loading a pickle can run code: an old pickled checkpoint is named, never unpickled."""
    ran = tmp_path / "ran"
    (tmp_path / "old.pkl").write_bytes(pickle.dumps(_RunsCode(str(ran))))
    with pytest.raises(CheckpointError, match="pickled checkpoint of an earlier spatialfed; pickles are no longer"):
        read_checkpoint(tmp_path / "old.pkl")
    assert not ran.exists()


class _RunsCode:
    """Unpickling this runs a side effect (a file appears): what a hostile pickle would do."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


# --- the data format: a snapshot reads back identical, no pickle ---------------------------------------------------
def assert_identical(a, b, where="snapshot"):
    """Same types all the way down, arrays bit for bit (dtype, shape, NaN positions), floats exactly."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and (a == b or (a != a and b != b)), where
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), where
        if isinstance(a, deque):
            assert a.maxlen == b.maxlen, where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, (set, frozenset)):
        assert a == b, where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif hasattr(a, "__dict__"):
        assert_identical(vars(a), vars(b), f"{where}.__dict__")
    else:
        assert a == b, where


def round_trip(tmp_path, snap, name="x.ckpt"):
    return read_checkpoint(write_checkpoint(tmp_path / name, snap))


def test_every_snapshot_of_an_async_fit_reads_back_identical(tmp_path):
    models, server = setup()
    inflight, i = {}, 0
    while not server.done:
        i = drive(server, models, inflight, i=i, stop=i + 1)
        snap = server.snapshot()
        assert_identical(snap, round_trip(tmp_path, snap))
    assert i > 30 and snap["phase"] == "done"


def test_privacy_and_dropped_worker_snapshots_read_back_identical(tmp_path):
    parts = simulate_parts(J=4, n=60, nu=0.5, seed=5)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    cfg = FitConfig.tuned(agg_threshold=2, privacy=GaussianMechanism(1e-6, 1e4, seed=1))
    server = FederatedServer(4, knots, kernel, cfg)
    snaps = []
    while server.t < 3:
        for j, p in server.dispatch():
            server.receive(evaluate(models[j], p, j), now=0.0)
        snaps.append(server.snapshot())
    server.drop_worker(3, "theta", "lost", now=1.0)
    snaps.append(server.snapshot())
    for snap in snaps:
        back = round_trip(tmp_path, snap)
        assert_identical(snap, back)
    assert isinstance(back["accountant"], PrivacyAccountant) and back["accountant"].releases
    assert back["dropped"][0]["worker"] == 3
    restored = FederatedServer.restore(back)
    assert restored.privacy_report == server.privacy_report and restored.config == server.config


@pytest.mark.parametrize("cut", ["init", "round"])
def test_fgpr_checkpoint_file_resumes_to_the_uninterrupted_fit(tmp_path, cut):
    from spatialfed.algorithm.fgpr import FgprConfig, FgprServer
    from spatialfed.runtime.virtual import run_virtual

    no_knots, kernel = np.zeros((0, 2)), Matern(0.5)
    models = [LocalModel(*p, no_knots, kernel, "full") for p in simulate_parts(J=4, n=50, nu=0.5, seed=3)]
    cfg = FgprConfig(max_iter=5, tol=0.0, participation=3, batch_size=16)
    whole = run_virtual(models, no_knots, kernel, server=FgprServer(4, kernel, cfg))
    server = FgprServer(4, kernel, cfg)
    while (server.phase == "moments") if cut == "init" else (server.t < 3):
        for j, p in server.dispatch():
            server.receive(evaluate(models[j], p, j), now=0.0)
    if cut == "round":
        (j, p), *_ = server.dispatch()
        server.receive(evaluate(models[j], p, j), now=0.0)
    snap = server.snapshot()
    back = round_trip(tmp_path, snap, "fgpr.ckpt")
    assert_identical(snap, back)
    assert isinstance(back["config"], FgprConfig)
    resumed = run_virtual(models, no_knots, kernel, server=FgprServer.restore(back))
    np.testing.assert_array_equal(resumed.params.gamma, whole.params.gamma)
    assert resumed.loglik == whole.loglik and resumed.iterations == whole.iterations == 5


def test_encoder_covers_the_tagged_types_and_keeps_shared_objects_shared(tmp_path):
    shared = Params(np.zeros(2), np.eye(2), np.array([1.0]), 1.0, 2.0, 0.5)
    arr = np.arange(6.0).reshape(2, 3)
    snap = {
        "floats": [float("nan"), float("inf"), -float("inf"), 0.1, -0.0, 1e308, 5e-324],
        "ints": [0, -1, 2**70], "np": [np.float64(0.1), np.int64(-3), np.bool_(True), np.float32(1.5), np.int32(7)],
        "keys": {(0, "theta"): 1, 3: "x", "$not_a_tag": 2, None: 4}, "tuple": (1, (2, "a"), []),
        "deque": deque([1, 2], maxlen=5), "set": {3, 1}, "frozen": frozenset({"a"}),
        "arrays": [arr, arr, np.array(2.5), np.zeros((0, 2)), np.array([1, 2], dtype=np.int8), arr[:, 1]],
        "shared": [shared, shared, Augmented(shared, 3, "theta", {"with": ("gamma",), "edges": np.ones(3)})],
        "q": Quantity({"A": np.eye(2), "n": 5}, 1, "mu_sigma", 2), "kernel": Matern(1.5),
    }
    back = round_trip(tmp_path, snap)
    assert_identical(snap, back)
    for changed in (np.float32(0.1), 0.1000000000000001, np.array(2.5, dtype=np.float32)):  # the check can fail
        with pytest.raises(AssertionError):
            assert_identical(snap, dict(back, np=[changed] + back["np"][1:], arrays=[changed] + back["arrays"][1:]))
    assert back["shared"][0] is back["shared"][1] is back["shared"][2].params  # shared stays shared ...
    assert back["arrays"][0] is back["arrays"][1]  # ... arrays too
    assert math.copysign(1.0, back["floats"][4]) == -1.0


@pytest.mark.parametrize("bad, where", [
    ({"f": lambda: 0}, r"snapshot\['f'\]"),
    ({"a": [np.array([object()])]}, r"object array at snapshot\['a'\]\[0\]"),
    ({"o": OrderedDict(a=1)}, r"OrderedDict at snapshot\['o'\]"),
])
def test_types_without_an_encoding_are_refused_at_write_time(tmp_path, bad, where):
    with pytest.raises(TypeError, match=where):
        write_checkpoint(tmp_path / "x.ckpt", bad)
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_json_and_npy_in_a_zip(tmp_path):
    models, server = setup()
    drive(server, models, {}, stop=12)
    path = write_checkpoint(tmp_path / "c.ckpt", server, meta={"store": "s.zarr"})
    with zipfile.ZipFile(path) as zf:
        doc = json.loads(zf.read("checkpoint.json"))
        names = zf.namelist()
        assert doc["magic"] == "spatialfed-checkpoint" and doc["version"] == 1
        assert doc["snapshot"]["meta"] == {"store": "s.zarr"} and doc["snapshot"]["t"] == server.t
        assert all(n == "checkpoint.json" or (n.startswith("arrays/") and n.endswith(".npy")) for n in names)
        with zf.open(names[-1]) as fh:
            np.lib.format.read_array(fh, allow_pickle=False)


def test_no_pickle_is_loaded_anywhere_in_the_package():
    """`grep -rn pickle spatialfed` finds no load of a pickle (nor np.load with allow_pickle)."""
    root = Path(checkpoint.__file__).resolve().parents[1]
    pattern = re.compile(r"pickle\.loads?\(|cloudpickle|allow_pickle\s*=\s*True|joblib\.load|shelve\.|dill\.")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


class _ForeignEnum(enum.Enum):
    A = "a"


@dataclasses.dataclass
class _ForeignData:
    x: int = 1


def _spatialfed_enums():
    """Enum members defined in spatialfed.model / spatialfed.algorithm (steps, phases, modes ...)."""
    members = []
    for info in pkgutil.walk_packages(spatialfed.__path__, "spatialfed."):
        if info.name.startswith(checkpoint.SAFE_MODULES):
            module = importlib.import_module(info.name)
            members += [next(iter(obj)) for obj in vars(module).values()
                        if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj.__module__ == info.name
                        and len(obj)]
    return members


def test_enums_and_dataclasses_of_the_algorithm_layers_round_trip(tmp_path):
    members = _spatialfed_enums()
    snap = {"members": members, "keyed": {m: i for i, m in enumerate(members)},
            "config": FitConfig.of(mode="async", agg_threshold=2), "kernel": Matern(2.5)}
    back = round_trip(tmp_path, snap)
    assert_identical(snap, back)
    assert all(type(a) is type(b) and a is b for a, b in zip(members, back["members"]))


@pytest.mark.parametrize("bad", [_ForeignEnum.A, _ForeignData()])
def test_classes_outside_the_algorithm_layers_are_refused(tmp_path, bad):
    with pytest.raises(TypeError, match=r"at snapshot\['x'\]"):
        write_checkpoint(tmp_path / "x.ckpt", {"x": bad})


@pytest.mark.parametrize("tag", [
    {"$obj": "os:system", "id": 0, "state": {"command": "touch ran"}},
    {"$obj": "subprocess:Popen", "id": 0, "state": {"args": ["true"]}},
    {"$enum": "spatialfed.runtime.interface:Runtime", "value": 1},
    {"$obj": "spatialfed.algorithm.server:FederatedServer", "id": 0, "state": {}},
    {"$obj": "spatialfed.model.params:np", "id": 0, "state": {}},
])
def test_a_crafted_file_constructs_nothing_else(tmp_path, tag):
    path = tmp_path / "crafted.ckpt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("checkpoint.json", json.dumps({"magic": checkpoint.MAGIC, "version": 1, "snapshot": {"x": tag}}))
    with pytest.raises(CheckpointError, match="does not restore"):
        read_checkpoint(path)
    assert sorted(os.listdir(tmp_path)) == ["crafted.ckpt"]
