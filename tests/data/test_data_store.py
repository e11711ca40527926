"""The SPEC §5 store: exact layout, atomic writes, validation messages, and per-worker reads."""

import json
import shutil
import time

import numpy as np
import pytest
import zarr

from spatialfed.data import store
from spatialfed.data.coords import MAX_ABS_COORD
from spatialfed.data.store import StoreInfo, load_test, load_worker, open_store, write_store
from spatialfed.errors import StoreError
from support import full_disk_beside_slow_parent_writes

TRUTH = {"gamma": [1.0, -2.0], "delta": 0.25, "sigma2": 1.0, "beta": 0.1, "nu": 0.5}


def make_parts(sizes=(5, 8, 3), p=2, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random((n, 2)), rng.standard_normal(n), rng.standard_normal((n, p))) for n in sizes]


@pytest.fixture
def written(tmp_path):
    parts = make_parts()
    test = make_parts((4,), seed=1)[0]
    path = tmp_path / "s.zarr"
    write_store(path, parts, partition="area", crs="EPSG:28992", covariate_names=["a", "b"], truth=TRUTH, test=test)
    return path, parts, test


def test_layout_follows_spec_with_plain_zarr(written):
    path, parts, test = written
    root = zarr.open_group(path, mode="r")
    attrs = dict(root.attrs)
    assert attrs["spatialfed_format"] == 1 and attrs["n_workers"] == 3 and attrs["partition"] == "area"
    assert attrs["crs"] == "EPSG:28992" and attrs["covariate_names"] == ["a", "b"] and attrs["truth"] == TRUTH
    assert sorted(root["workers"].group_keys()) == ["0", "1", "2"]
    for j, (locs, z, X) in enumerate(parts):
        g = root[f"workers/{j}"]
        assert g["locs"].dtype == np.float64 and g["locs"].shape == (len(z), 2)
        np.testing.assert_array_equal(g["locs"][...], locs)
        np.testing.assert_array_equal(g["z"][...], z)
        np.testing.assert_array_equal(g["X"][...], X)
    np.testing.assert_array_equal(root["test/z"][...], test[1])
    assert json.loads((path / "zarr.json").read_text())["zarr_format"] == 3


def test_open_store_describes_it(written):
    path, parts, _ = written
    info = open_store(path)
    assert info == StoreInfo(path=path, n_workers=3, partition="area", crs="EPSG:28992", covariate_names=["a", "b"],
                             truth=TRUTH, sizes=[5, 8, 3], has_test=True, fingerprint=info.fingerprint,
                             checksums=info.checksums, test_checksum=info.test_checksum)
    assert info.fingerprint.startswith("sha256:") and len(info.checksums) == 3 and info.test_checksum


def test_load_worker_and_test_round_trip(written):
    path, parts, test = written
    for j, part in enumerate(parts):
        for got, want in zip(load_worker(path, j), part):
            np.testing.assert_array_equal(got, want)
    for got, want in zip(load_test(path), test):
        np.testing.assert_array_equal(got, want)


def test_load_worker_reads_only_its_own_group(written):
    path, parts, _ = written
    shutil.rmtree(path / "workers" / "0")
    shutil.rmtree(path / "test")
    for chunk in (path / "workers" / "2").rglob("c/*"):
        if chunk.is_file():
            chunk.write_bytes(b"corrupted")
    np.testing.assert_array_equal(load_worker(path, 1)[1], parts[1][1])
    with pytest.raises(StoreError, match="workers/0"):
        load_worker(path, 0)
    with pytest.raises(StoreError, match="damaged"):
        load_worker(path, 2)
    with pytest.raises(StoreError, match="expected exactly 0..2"):
        open_store(path)


def test_existing_output_is_refused_unless_overwrite(written):
    path, parts, _ = written
    with pytest.raises(StoreError, match="already exists"):
        write_store(path, parts[:1], partition="random", crs=None, covariate_names=["a", "b"])
    info = write_store(path, parts[:1], partition="random", crs=None, covariate_names=["a", "b"], overwrite=True)
    assert info.n_workers == 1 and not info.has_test and info.truth is None


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def failing(group, part):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(group, part)

    real = store._write_arrays
    monkeypatch.setattr(store, "_write_arrays", failing)
    with pytest.raises(OSError):
        write_store(tmp_path / "s.zarr", make_parts(), partition="random", crs=None, covariate_names=["a", "b"])
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_waits_for_zarrs_writes_still_in_flight(tmp_path, monkeypatch):
    full_disk_beside_slow_parent_writes(monkeypatch, "locs/zarr.json")
    with pytest.raises(OSError):
        write_store(tmp_path / "s.zarr", make_parts(), partition="random", crs=None, covariate_names=["a", "b"])
    time.sleep(0.6)  # longer than the slow sibling: whatever it would write has been written
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == []


def test_failed_overwrite_keeps_the_old_store(written, monkeypatch):
    path, parts, _ = written
    monkeypatch.setattr(store, "_write_arrays", lambda g, p: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_store(path, parts, partition="random", crs=None, covariate_names=["a", "b"], overwrite=True)
    assert open_store(path).partition == "area"
    assert sorted(p.name for p in path.parent.iterdir()) == ["s.zarr"]


@pytest.mark.parametrize(
    "parts, kwargs, message",
    [
        ([], {}, "at least one worker"),
        (make_parts(p=3), {}, r"X must have shape \(5, 2\)"),
        ([(np.zeros((3, 3)), np.zeros(3), np.zeros((3, 2)))], {}, r"locs must have shape \(3, 2\)"),
        ([(np.zeros((2, 2)), np.array([1.0, np.nan]), np.zeros((2, 2)))], {}, "worker 0: z holds NaN"),
        ([(np.array([[0.0, np.inf], [1, 1]]), np.zeros(2), np.zeros((2, 2)))], {}, "worker 0: locs holds NaN or inf"),
        ([(np.zeros((2, 2)), np.zeros(2), np.array([[0.0, 1], [np.nan, 1]]))], {}, "worker 0: X holds NaN"),
        ([(np.zeros((2, 2)), np.zeros(2))], {}, r"worker 0 must be a \(locs, z, X\) triple"),
        ([(np.zeros((2, 2)), np.zeros((2, 1)), np.zeros((2, 2)))], {}, r"z must be a non-empty 1-D array, got shape \(2, 1\)"),
        ([(np.zeros((0, 2)), np.zeros(0), np.zeros((0, 2)))], {}, r"z must be a non-empty 1-D array, got shape \(0,\)"),
        (make_parts(), {"test": (np.zeros((2, 2)), np.array([np.nan, 1]), np.zeros((2, 2)))}, "test set: z holds NaN"),
        ([(np.full((2, 2), 2 * MAX_ABS_COORD), np.zeros(2), np.zeros((2, 2)))], {}, "beyond ±1e"),
        (make_parts(), {"partition": "blocks"}, "partition 'blocks'"),
        (make_parts(), {"truth": {"gamma": [1.0]}}, "truth is missing"),
        (make_parts(), {"truth": dict(TRUTH, gamma=[1.0])}, "gamma has 1 entries"),
    ],
)
def test_write_rejects_bad_input(tmp_path, parts, kwargs, message):
    options = dict(partition="random", crs=None, covariate_names=["a", "b"]) | kwargs
    with pytest.raises(StoreError, match=message):
        write_store(tmp_path / "s.zarr", parts, **options)
    assert list(tmp_path.iterdir()) == []


def test_integer_input_and_one_row_partitions_are_stored_as_float64(tmp_path):
    parts = [(np.array([[1, 2]]), np.array([3]), np.array([[1, 5]])), (np.array([[0, 0], [4, 4]]), np.array([1, 2]),
                                                                        np.array([[1, 6], [1, 7]]))]
    info = write_store(tmp_path / "s.zarr", parts, partition="random", crs=None, covariate_names=["a", "b"])
    assert info.sizes == [1, 2]
    edge = [(np.array([[MAX_ABS_COORD, -MAX_ABS_COORD]]), np.zeros(1), np.zeros((1, 2)))]  # the limit itself is in
    assert write_store(tmp_path / "edge.zarr", edge, partition="random", crs=None, covariate_names=["a", "b"]).sizes == [1]
    for j, part in enumerate(parts):
        for got, want in zip(load_worker(tmp_path / "s.zarr", j), part):
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, want)


def edit_root(path, **changes):
    meta = json.loads((path / "zarr.json").read_text())
    for key, value in changes.items():
        if value is None:
            meta["attributes"].pop(key)
        else:
            meta["attributes"][key] = value
    (path / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"spatialfed_format": 2}, "spatialfed_format"),
        ({"crs": None}, "'crs' is missing"),
        ({"n_workers": 4}, "expected exactly 0..3"),
        ({"n_workers": "3"}, "positive integer"),
        ({"partition": "zones"}, "partition 'zones'"),
        ({"covariate_names": ["a"]}, "truth gamma has 2 entries but there are 1 covariates"),
        ({"covariate_names": ["a"], "truth": None}, r"expected \(5, 1\)"),
    ],
)
def test_open_store_says_what_is_wrong(written, changes, message):
    path, _, _ = written
    edit_root(path, **changes)
    with pytest.raises(StoreError, match=message):
        open_store(path)


def test_open_store_rejects_missing_array_and_non_store(written, tmp_path):
    path, _, _ = written
    shutil.rmtree(path / "workers" / "1" / "X")
    with pytest.raises(StoreError, match="'workers/1' has no array 'X'"):
        open_store(path)
    with pytest.raises(StoreError, match="not a Zarr v3 store"):
        open_store(tmp_path / "nothing.zarr")


def test_load_errors(written):
    path, parts, _ = written
    with pytest.raises(StoreError, match="out of range"):
        load_worker(path, 3)
    write_store(path, parts, partition="random", crs=None, covariate_names=["a", "b"], overwrite=True)
    with pytest.raises(StoreError, match="no test group"):
        load_test(path)
