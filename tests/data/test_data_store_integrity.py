"""Store integrity: per-partition row counts and checksums, the store fingerprint, legacy stores, the Store handle."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings

import numpy as np
import pytest
import zarr

from spatialfed.data import store as store_mod
from spatialfed.data.store import Store, checksum, load_test, load_worker, open_store, store_fingerprint, write_store
from spatialfed.errors import StoreError


def make_parts(sizes=(5, 8, 3), p=2, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random((n, 2)), rng.standard_normal(n), rng.standard_normal((n, p))) for n in sizes]


def write(path, seed=0, **kw):
    options = dict(partition="area", crs="EPSG:28992", covariate_names=["a", "b"],
                   test=make_parts((4,), seed=seed + 1)[0]) | kw
    return write_store(path, make_parts(seed=seed), **options)


def edit_attrs(meta_path, **changes):
    meta = json.loads(meta_path.read_text())
    for key, value in changes.items():
        if value is None:
            meta["attributes"].pop(key, None)
        else:
            meta["attributes"][key] = value
    meta_path.write_text(json.dumps(meta))


def test_each_partition_records_rows_and_checksum(tmp_path):
    path = tmp_path / "s.zarr"
    st = write(path)
    parts = make_parts()
    for j, part in enumerate(parts):
        attrs = dict(zarr.open_group(path, path=f"workers/{j}", mode="r").attrs)
        assert attrs == {"n_rows": len(part[1]), "sha256": checksum(*part)}
    assert st.checksums == tuple(checksum(*part) for part in parts)
    assert st.fingerprint == store_fingerprint(path) == dict(zarr.open_group(path, mode="r").attrs)["fingerprint"]
    assert st.verified


def test_a_deleted_chunk_is_refused_not_read_as_zeros(tmp_path):
    path = tmp_path / "s.zarr"
    st = write(path)
    chunk = path / "workers" / "1" / "z" / "c" / "0"
    assert chunk.is_file()
    chunk.unlink()
    # Zarr itself reads the missing chunk as its fill value: exactly the silent wrong answer refused here
    assert np.all(zarr.open_group(path, mode="r")["workers/1/z"][...] == 0)
    for load in (lambda: load_worker(path, 1), lambda: st.load_worker(1)):
        with pytest.raises(StoreError, match=r"partition workers/1 is damaged.*re-ingest the data"):
            load()
    np.testing.assert_array_equal(load_worker(path, 0)[1], make_parts()[0][1])  # the others still load


def test_a_corrupted_chunk_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    write(path)
    # a chunk that still decodes, with one value changed (silent corruption)
    arr = zarr.open_array(path / "workers" / "2" / "X", mode="r+")
    arr[1, 0] = arr[1, 0] + 1e-9
    with pytest.raises(StoreError, match=r"partition workers/2 is damaged: its data do not match the checksum"):
        load_worker(path, 2)
    # a chunk whose bytes are garbled: either the codec refuses it or the checksum does
    chunk = path / "test" / "locs" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match=r"partition test .*damaged"):
        load_test(path)


def test_row_count_and_records_are_checked(tmp_path):
    path = tmp_path / "s.zarr"
    write(path)
    edit_attrs(path / "workers" / "1" / "zarr.json", n_rows=7)
    with pytest.raises(StoreError, match=r"partition workers/1 holds 8 rows but 7 were written"):
        load_worker(path, 1)
    with pytest.raises(StoreError, match="holds 8 rows but 7"):
        open_store(path)
    edit_attrs(path / "workers" / "1" / "zarr.json", n_rows=8, sha256=12)
    with pytest.raises(StoreError, match="malformed integrity records"):
        load_worker(path, 1)


def test_fingerprint_names_a_modified_store(tmp_path):
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    fa, fb = write(a).fingerprint, write(b, seed=5).fingerprint
    assert fa != fb and open_store(a).fingerprint == fa  # stable across opens, different data → different
    shutil.rmtree(a / "workers" / "1")
    shutil.copytree(b / "workers" / "1", a / "workers" / "1")  # a partition from another store
    with pytest.raises(StoreError, match="fingerprint does not match"):
        open_store(a)
    write(a, overwrite=True)
    edit_attrs(a / "zarr.json", crs="EPSG:4326")  # an attribute changed after writing
    with pytest.raises(StoreError, match="fingerprint does not match"):
        open_store(a)


def test_extra_attributes_round_trip_the_fingerprint(tmp_path):
    st = write(tmp_path / "s.zarr", partition="column:agency", extra_attrs={"worker_labels": ["x", "y", "z"],
                                                                             "simulation": {"seed": 2}})
    assert open_store(st.path).fingerprint == st.fingerprint and st.worker_labels == ["x", "y", "z"]


def test_legacy_store_loads_with_one_warning(tmp_path):
    path = tmp_path / "old.zarr"
    write(path)
    edit_attrs(path / "zarr.json", fingerprint=None)
    for where in ("workers/0", "workers/1", "workers/2", "test"):
        edit_attrs(path / where / "zarr.json", n_rows=None, sha256=None)
    with pytest.warns(UserWarning, match="before stores recorded checksums"):
        st = open_store(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per store and process
        assert open_store(path).fingerprint == st.fingerprint
        np.testing.assert_array_equal(st.load_worker(1)[1], make_parts()[1][1])
        np.testing.assert_array_equal(load_test(path)[0], make_parts((4,), seed=1)[0][0])
    assert st.fingerprint.startswith("legacy-sha256:") and not st.verified and st.checksums == (None,) * 3
    assert store_fingerprint(path) == st.fingerprint
    shutil.copytree(path, tmp_path / "old2.zarr")
    with pytest.warns(UserWarning, match="old2.zarr was written before stores recorded checksums"):  # once per store
        open_store(tmp_path / "old2.zarr")
    write(tmp_path / "half.zarr")
    edit_attrs(tmp_path / "half.zarr" / "workers" / "2" / "zarr.json", n_rows=None, sha256=None)
    with pytest.raises(StoreError, match=r"partitions \['workers/2'\] have no integrity records"):
        open_store(tmp_path / "half.zarr")


def test_store_handle(tmp_path):
    path = tmp_path / "s.zarr"
    st = write(path)
    assert isinstance(st, Store) and open_store(st) is st and os.fspath(st) == str(path)
    assert (st.p, st.n_obs, st.sizes, st.has_test) == (2, 16, [5, 8, 3], True)
    assert st.parsed_crs.to_epsg() == 28992 and st.parsed_crs is st.parsed_crs  # parsed once
    back = pickle.loads(pickle.dumps(st))
    assert "parsed_crs" not in vars(back) and back == st
    for j, part in enumerate(make_parts()):
        for got, want in zip(st.load_worker(j), part):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(load_worker(st, j), part):  # the module functions accept the handle
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(st.load_test()[1], make_parts((4,), seed=1)[0][1])
    with pytest.raises(StoreError, match=r"worker index 3 out of range; the store has workers 0..2"):
        st.load_worker(3)
    with pytest.raises(StoreError, match="out of range"):
        st.load_worker(True)
    no_test = write(tmp_path / "n.zarr", test=None)
    assert no_test.parsed_crs is not None and no_test.test_checksum is None
    with pytest.raises(StoreError, match="no test group"):
        no_test.load_test()
    assert write(tmp_path / "planar.zarr", crs=None).parsed_crs is None


def test_handle_refuses_a_store_rewritten_after_opening(tmp_path):
    path = tmp_path / "s.zarr"
    st = write(path)
    write(path, seed=9, overwrite=True)
    with pytest.raises(StoreError, match=r"partition workers/0 changed since the store was opened"):
        st.load_worker(0)
    with pytest.raises(StoreError, match=r"partition test changed since the store was opened"):
        st.load_test()
    assert open_store(path).load_worker(0)[1].shape == (5,)


def test_checksum_cost_is_one_pass_over_the_bytes(monkeypatch):
    """Checking costs one sha256 pass over the partition's bytes (counted, not timed): 8 bytes a value, plus the
    three short name-and-shape headers, at 10^5 rows."""
    import hashlib

    hashed, sha256 = [], hashlib.sha256

    class Counting:
        def __init__(self):
            self._h = sha256()

        def update(self, data):
            hashed.append(memoryview(data).nbytes)
            self._h.update(data)

        def hexdigest(self):
            return self._h.hexdigest()

    rng = np.random.default_rng(0)
    n = 100_000
    part = (rng.random((n, 2)), rng.standard_normal(n), rng.standard_normal((n, 5)))
    expected = checksum(*part)
    monkeypatch.setattr(store_mod.hashlib, "sha256", Counting)
    assert store_mod.checksum(*part) == expected
    values = 8 * sum(a.size for a in part)
    assert values <= sum(hashed) <= values + 100  # 6.4 MB once, and the headers
    assert store_mod.checksum(*(np.asfortranarray(a) for a in part)) == expected  # memory order is not hashed


def test_store_fingerprint_reads_the_record_without_checking_it(tmp_path):
    """store_fingerprint is the cheap read of what was recorded; open_store is the check that refuses a change."""
    path = tmp_path / "s.zarr"
    st = write(path)
    edit_attrs(path / "zarr.json", partition="random")
    assert store_fingerprint(path) == st.fingerprint
    with pytest.raises(StoreError, match="recorded fingerprint does not match"):
        open_store(path)


@pytest.mark.parametrize("key", ["delta", "sigma2", "beta", "nu"])
def test_truth_parameters_must_be_positive(tmp_path, key):
    truth = {"gamma": [1, 2], "delta": 4, "sigma2": 1, "beta": 0.2, "nu": 0.5}
    st = write(tmp_path / "s.zarr", truth=truth)
    assert st.truth == {"gamma": [1.0, 2.0], "delta": 4.0, "sigma2": 1.0, "beta": 0.2, "nu": 0.5}
    assert all(type(v) is float for k, v in st.truth.items() if k != "gamma")
    with pytest.raises(StoreError, match=rf"truth {key} must be > 0, got 0"):
        write(tmp_path / "zero.zarr", truth=truth | {key: 0})


def test_the_fixes_named_in_python_spelling(tmp_path):
    no_test = write(tmp_path / "n.zarr", test=None)
    with pytest.raises(StoreError, match=r"create it with test_size= \(simulate_store\) or test_fraction= \(ingest\)$"):
        no_test.load_test()
    path = tmp_path / "s.zarr"
    write(path)
    edit_attrs(path / "workers" / "1" / "zarr.json", n_rows=7)
    with pytest.raises(StoreError, match=r"re-ingest the data \(ingest\(\.\.\., overwrite=True\) or "
                                         r"simulate_store\(\.\.\., overwrite=True\)\) or restore the store"):
        open_store(path)


def test_checksum_is_of_the_float64_values_whatever_the_input_dtype_or_byte_order():
    locs, z, X = make_parts((6,))[0]
    ref = checksum(locs, z, X)
    assert checksum(locs.astype(">f8"), z.astype(">f8"), X.astype(">f8")) == ref
    assert checksum(np.ones((2, 2), dtype=int), np.arange(2), np.zeros((2, 1), dtype=np.int32)) == \
        checksum(np.ones((2, 2)), np.arange(2.0), np.zeros((2, 1)))


def test_load_worker_refuses_a_non_integer_index_and_reads_float32_arrays_as_float64(tmp_path):
    path = tmp_path / "s.zarr"
    write(path)
    for j in (True, 1.0, -1, 3):
        with pytest.raises(StoreError, match=rf"worker index {j!r} out of range"):
            load_worker(path, j)
    # another writer stored z as float32; its values are exact in float32, so the checksum still holds
    parts = make_parts()
    z = np.round(parts[1][1] * 4) / 4
    parts[1] = (parts[1][0], z, parts[1][2])
    st = write_store(tmp_path / "f32.zarr", parts, partition="area", crs="EPSG:28992", covariate_names=["a", "b"])
    group = zarr.open_group(tmp_path / "f32.zarr" / "workers" / "1", mode="a")
    group.create_array("z", data=z.astype(np.float32), chunks=(len(z),), overwrite=True)
    for got in (load_worker(tmp_path / "f32.zarr", 1)[1], st.load_worker(1)[1]):
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, z)


def test_fingerprint_and_checksums_of_a_fixed_store_do_not_change_between_versions(tmp_path):
    """Stores written by earlier versions must open: the recorded values of this store (written on 27 Nov 2026)
    are pinned, so a change to what is hashed, or how, fails here rather than refusing every existing store."""
    parts = [(np.arange(6.0).reshape(3, 2) / 8, np.array([0.5, -1.0, 2.0]), np.ones((3, 2))),
             (np.array([[1.0, 1.0]]), np.array([3.0]), np.array([[1.0, 0.25]]))]
    st = write_store(tmp_path / "s.zarr", parts, partition="area", crs="EPSG:28992", covariate_names=["a", "b"],
                     truth={"gamma": [1, 2], "delta": 4, "sigma2": 1, "beta": 0.2, "nu": 0.5})
    assert st.checksums == ("935c6edbf18f6a2e9a6713154f7bef3d3d388192e7008a7dc42f3567eaa801e5",
                            "ca006a5bf857ff6ea593489ed8f293a580d7b44cfb681649adcea660f14a2f0b")
    assert st.fingerprint == "sha256:8210775a0d743f21e244b9506206dc85711f00095fba526f8ca7a102b72f213a"


# --- edges the mutation run of open_store's helpers (27 Nov) found unguarded (docs/contributing.md) ---------------

def test_checksums_stripped_from_every_group_under_a_fingerprinted_root_are_refused(tmp_path):
    """Only a store with no fingerprint at all is old: removing every group's records (to change the values
    unchecked) while the root keeps its fingerprint is refused, not loaded with the legacy warning."""
    path = tmp_path / "s.zarr"
    write(path)
    for where in ("workers/0", "workers/1", "workers/2", "test"):
        edit_attrs(path / where / "zarr.json", n_rows=None, sha256=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no legacy warning either
        with pytest.raises(StoreError, match=r"integrity records \(n_rows, sha256\) are missing, but the root "
                                             r"records a fingerprint"):
            open_store(path)


def test_a_partition_with_one_integrity_record_of_two_is_malformed_not_legacy(tmp_path):
    """A legacy store has neither record; a partition with only one of them was damaged or mixed in."""
    for gone in ("n_rows", "sha256"):
        path = tmp_path / f"no-{gone}.zarr"
        write(path)
        edit_attrs(path / "workers" / "1" / "zarr.json", **{gone: None})
        with pytest.raises(StoreError, match=r"partition workers/1 has malformed integrity records"):
            open_store(path)


def test_a_partition_with_integer_arrays_or_a_z_that_is_not_a_vector_is_refused_at_open(tmp_path):
    path = tmp_path / "s.zarr"
    write(path)
    group = zarr.open_group(path / "workers" / "1", mode="a")
    X = group["X"][...]
    group.create_array("X", data=np.round(X).astype(np.int64), chunks=X.shape, overwrite=True)
    with pytest.raises(StoreError, match=r"'workers/1/X' has dtype int64, expected float64"):
        open_store(path)
    group.create_array("X", data=X, chunks=X.shape, overwrite=True)
    z = group["z"][...]
    for bad in (np.array(1.0), z[:, None]):  # no row count, or rows of one column: z is named, not locs
        group.create_array("z", data=bad, overwrite=True)
        with pytest.raises(StoreError, match=rf"'workers/1/z' has shape {re.escape(str(bad.shape))}, expected \(n,\)"):
            open_store(path)


def test_open_store_reads_the_metadata_on_disk_not_a_consolidated_copy(tmp_path):
    """zarr.consolidate_metadata copies the metadata below a group into its zarr.json; open_store reads the groups
    and arrays that are there now (an array deleted, or a worker group added, after consolidating is seen)."""
    path = tmp_path / "s.zarr"
    write(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # consolidated metadata is not part of Zarr v3 (a ZarrUserWarning)
        zarr.consolidate_metadata(path, path="workers/1")
        zarr.consolidate_metadata(path)
    shutil.copytree(path, tmp_path / "extra.zarr")
    shutil.rmtree(path / "workers" / "1" / "X")
    with pytest.raises(StoreError, match=r"group 'workers/1' has no array 'X'"):
        open_store(path)
    shutil.copytree(tmp_path / "extra.zarr" / "workers" / "0", tmp_path / "extra.zarr" / "workers" / "3")
    with pytest.raises(StoreError, match=r"workers/ holds groups \['0', '1', '2', '3'\], expected exactly 0..2"):
        open_store(tmp_path / "extra.zarr")


@pytest.mark.parametrize("rows", [8.0, "8", True])
def test_a_row_count_that_is_not_an_integer_is_a_malformed_record(tmp_path, rows):
    path = tmp_path / "s.zarr"
    write(path)
    edit_attrs(path / "workers" / "1" / "zarr.json", n_rows=rows)
    with pytest.raises(StoreError, match=rf"malformed integrity records \(n_rows={re.escape(repr(rows))},"):
        open_store(path)


@pytest.mark.parametrize("changes, message", [
    ({"n_workers": 0}, "n_workers must be a positive integer, got 0"),
    ({"n_workers": True}, "n_workers must be a positive integer, got True"),
    ({"covariate_names": []}, r"covariate_names must be a non-empty list of strings, got \[\]"),
    ({"covariate_names": ["a", 1]}, r"covariate_names must be a non-empty list of strings, got \['a', 1\]"),
    ({"covariate_names": "ab"}, "covariate_names must be a non-empty list of strings, got 'ab'"),
])
def test_root_attributes_of_the_wrong_kind_are_named_before_the_fingerprint(tmp_path, changes, message):
    path = tmp_path / "s.zarr"
    write(path)
    edit_attrs(path / "zarr.json", **changes)
    with pytest.raises(StoreError, match=message):
        open_store(path)


def test_the_truth_of_a_store_is_read_as_floats_whatever_its_json_spelling(tmp_path):
    """A legacy store (no fingerprint to break) whose truth another writer spelt with integers."""
    path = tmp_path / "s.zarr"
    write(path, truth={"gamma": [1.0, 2.0], "delta": 4.0, "sigma2": 1.0, "beta": 0.2, "nu": 0.5})
    edit_attrs(path / "zarr.json", fingerprint=None,
               truth={"gamma": [1, 2], "delta": 4, "sigma2": 1, "beta": 0.2, "nu": 0.5})
    for where in ("workers/0", "workers/1", "workers/2", "test"):
        edit_attrs(path / where / "zarr.json", n_rows=None, sha256=None)
    with pytest.warns(UserWarning, match="before stores recorded checksums"):
        truth = open_store(path).truth
    assert truth == {"gamma": [1.0, 2.0], "delta": 4.0, "sigma2": 1.0, "beta": 0.2, "nu": 0.5}
    assert all(type(v) is float for v in [*truth["gamma"], *(truth[k] for k in ("delta", "sigma2", "beta", "nu"))])


def test_the_worker_groups_found_are_listed_in_numeric_order(tmp_path):
    path = tmp_path / "s.zarr"
    write_store(path, make_parts((3,) * 11), partition="area", crs=None, covariate_names=["a", "b"])
    edit_attrs(path / "zarr.json", n_workers=12)
    groups = ", ".join(f"'{j}'" for j in range(11))
    with pytest.raises(StoreError, match=re.escape(f"workers/ holds groups [{groups}], expected exactly 0..11")):
        open_store(path)


@pytest.mark.parametrize("where", [("workers", "1"), ()])
def test_a_truncated_metadata_file_is_named(tmp_path, where):
    """A group's or the root's zarr.json cut short is named, not reported as a bare JSON parser message."""
    path = tmp_path / "s.zarr"
    write(path)
    meta = path.joinpath(*where, "zarr.json")
    meta.write_bytes(meta.read_bytes()[:40])  # cut inside a string
    with pytest.raises(StoreError, match=rf"{re.escape(str(meta))} is not valid JSON \(.*\): the store's metadata "
                                         r"is truncated or damaged; re-ingest"):
        open_store(path)
