"""The store checksum at bit level: one flipped bit of one stored float64 is a different checksum and a refused load.

The flip is the lowest mantissa bit (a relative change of 2⁻⁵²), the smallest corruption a float64 can have: a
checksum of values cast to a narrower type, or rounded, would pass it.
"""

import numpy as np
import pytest
import zarr

from spatialfed.data.store import checksum, load_test, load_worker, open_store, write_store
from spatialfed.errors import StoreError


def flip_lowest_bit(values: np.ndarray, index) -> np.ndarray:
    out = np.array(values, dtype="<f8", copy=True)
    out.view("<u8")[index] ^= np.uint64(1)
    return out


@pytest.fixture()
def tiny_store(tmp_path):
    rng = np.random.default_rng(7)
    parts = [(rng.uniform(size=(n, 2)), rng.standard_normal(n), rng.standard_normal((n, 2))) for n in (6, 9)]
    test = (rng.uniform(size=(4, 2)), rng.standard_normal(4), rng.standard_normal((4, 2)))
    path = tmp_path / "s.zarr"
    write_store(path, parts, partition="random", crs=None, covariate_names=["a", "b"], test=test)
    return path, parts


@pytest.mark.parametrize("name, index", [("locs", (2, 1)), ("z", 4), ("X", (7, 0))])
def test_checksum_sees_the_lowest_mantissa_bit(tiny_store, name, index):
    _, parts = tiny_store
    locs, z, X = parts[1]
    arrays = {"locs": locs, "z": z, "X": X}
    flipped = flip_lowest_bit(arrays[name], index)
    assert flipped[index] != arrays[name][index] and flipped[index] == pytest.approx(arrays[name][index], rel=1e-15)
    arrays[name] = flipped
    assert checksum(arrays["locs"], arrays["z"], arrays["X"]) != checksum(locs, z, X)
    assert checksum(locs, z, X) == checksum(locs.copy(), z.copy(), X.copy())  # and it is a function of the values


@pytest.mark.parametrize("group, name, index", [("workers/1", "z", 4), ("workers/0", "locs", (3, 0)),
                                                ("workers/1", "X", (8, 1)), ("test", "z", 2)])
def test_one_flipped_bit_in_a_stored_float64_is_refused(tiny_store, group, name, index):
    path, _ = tiny_store
    array = zarr.open_array(path / group / name, mode="r+")
    values = array[...]
    array[...] = flip_lowest_bit(values, index)
    assert np.count_nonzero(array[...] != values) == 1  # exactly one value changed, by one bit
    info = open_store(path)  # the metadata are intact: only the data check can tell
    load = (lambda: load_test(path)) if group == "test" else (lambda: load_worker(path, int(group[-1])))
    with pytest.raises(StoreError, match=f"partition {group} is damaged"):
        load()
    handle_load = info.load_test if group == "test" else (lambda: info.load_worker(int(group[-1])))
    with pytest.raises(StoreError, match=f"partition {group} is damaged"):
        handle_load()
    other = "workers/0" if group != "workers/0" else "workers/1"
    load_worker(path, int(other[-1]))  # the intact partitions still load
