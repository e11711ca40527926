"""The default prediction domain covers the study area: the default map of every shipped dataset has a value at
every cell inside the convex hull of its observation sites (no holes or slits where sites meet)."""

import json

import numpy as np
import pandas as pd
import pytest
import rasterio
import shapely

from spatialfed.api import FederatedGP
from spatialfed.data import datasets, geometry
from spatialfed.data.ingest import ingest_frame
from spatialfed.data.store import load_test, load_worker, open_store
from spatialfed.outputs import maps
from spatialfed.outputs import prediction as pr

SHIPPED = {  # as the user guide ingests them: Meuse zinc in 4 area sites with a test group; ozone by state
    "meuse": lambda path: ingest_frame(pd.read_csv(datasets.data_file("meuse", "meuse.csv")), path, value="zinc",
                                       x="x", y="y", crs="EPSG:28992", n_workers=4, test_fraction=0.2),
    "ozone": lambda path: datasets.ozone_store(path)}


@pytest.fixture(scope="module", params=sorted(SHIPPED))
def shipped_fit(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    info, _ = SHIPPED[request.param](d / "s.zarr")
    FederatedGP(mode="sync", knots=16, cluster="simulated", max_iter=3, progress=False).fit(d / "s.zarr") \
        .save(d / "fit")
    return d, d / "s.zarr", d / "fit"


def sites_of(store):
    """All observation sites of the store (training partitions)."""
    info = open_store(store)
    return np.vstack([load_worker(store, j)[0] for j in range(info.n_workers)])


def test_the_default_map_has_a_value_at_every_cell_inside_the_hull_of_the_sites(shipped_fit):
    d, store, fit = shipped_fit
    paths = maps.make_map(fit, store, d / "map", runtime="simulated")
    hull = shapely.convex_hull(shapely.multipoints(sites_of(store)))
    with rasterio.open(paths["mean"]) as src:
        mean = src.read(1)
        rows, cols = np.mgrid[0:src.height, 0:src.width]
        xs, ys = rasterio.transform.xy(src.transform, rows.ravel(), cols.ravel())
    inside = shapely.contains_xy(hull, np.asarray(xs), np.asarray(ys))
    assert inside.sum() > 1000  # a real map, not a handful of cells
    assert np.isfinite(mean.ravel()[inside]).all(), f"{int(np.isnan(mean.ravel()[inside]).sum())} holes"
    assert json.loads(paths["json"].read_text())["cells"] >= inside.sum()


def test_the_old_union_of_site_hulls_would_leave_holes(shipped_fit):
    """The reason for the hull: the union of the sites' own hulls misses cells between sites."""
    d, store, _ = shipped_fit
    info = open_store(store)
    hulls = [geometry.points_hull(load_worker(store, j)[0]) for j in range(info.n_workers)]
    sites = sites_of(store)
    hull = geometry.Domain(shapely.convex_hull(shapely.multipoints(sites)), info.crs)
    cells = geometry.prediction_grid(hull, maps.nice_resolution(hull)).points
    assert (~geometry.domain_from_hulls(hulls, info.crs).contains(cells)).sum() > 100
    assert geometry.store_hull_domain(info, lambda: hulls).contains(cells).all()
    box = geometry.store_hull_domain(info, lambda: hulls, kind="bbox").geometry
    assert box.equals(shapely.box(*geometry.store_hull_domain(info, lambda: hulls).geometry.bounds))


def test_predict_at_the_test_group_flags_none_and_bbox_is_accepted(shipped_fit, recwarn):
    d, store, fit = shipped_fit
    if not open_store(store).has_test:
        pytest.skip("this dataset's store has no test group")
    frame, scores = pr.predict(fit, store, runtime="simulated")
    locs0 = load_test(store)[0]
    hull = shapely.convex_hull(shapely.multipoints(sites_of(store)))
    inside = shapely.contains_xy(hull, locs0[:, 0], locs0[:, 1])
    assert not frame["outside_domain"][inside].any()
    frame_box, _ = pr.predict(fit, store, domain="bbox", runtime="simulated")
    assert frame_box["outside_domain"].sum() <= frame["outside_domain"].sum()


def test_an_unknown_domain_kind_is_one_line():
    info = type("Info", (), {"crs": "EPSG:28992", "truth": None})()
    with pytest.raises(Exception, match=r"^the default domain must be one of hull, bbox \(or a polygon file\)"):
        geometry.store_hull_domain(info, lambda: [], kind="convex")
