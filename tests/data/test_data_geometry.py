"""Domains, knot grids (counts, clipping), prediction grids and CRS projection round trips."""

import geopandas as gpd
import numpy as np
import pytest
import shapely
from pyproj import Transformer

from spatialfed.data import geometry as G
from spatialfed.errors import DataError

TRIANGLE = G.Domain(shapely.Polygon([(0, 0), (3, 0), (0, 2)]))
UNIT = G.domain_from_bbox(0, 0, 1, 1)


def test_jittered_unit_grid_is_the_papers_design():
    pts = G.jittered_unit_grid(100, seed=0)
    assert pts.shape == (100, 2) and pts.min() >= 0 and pts.max() <= 1
    cell = np.round(pts * (10 - 1 + 0.8) - 0.4)  # undo the scaling: nearest integer grid node
    assert len({tuple(c) for c in cell}) == 100  # one point per grid cell
    assert np.all(np.abs(pts * 9.8 - 0.4 - cell) <= 0.4 + 1e-12)
    assert G.jittered_unit_grid(90, seed=0).shape == (90, 2)  # 90 of the 10×10 cells


def test_regular_knots_exact_count_on_unit_square():
    knots = G.regular_knots(UNIT, 100)
    assert knots.shape == (100, 2)
    np.testing.assert_allclose(np.unique(knots[:, 0]), np.arange(0.05, 1, 0.1))


def test_regular_knots_report_nearest_feasible_count():
    with pytest.warns(UserWarning, match="using 49"):
        assert len(G.regular_knots(UNIT, 50)) == 49


@pytest.mark.parametrize("m", [10, 37, 100, 250])
def test_knots_are_clipped_to_domain_with_exact_count(m):
    jit = G.jittered_knots(TRIANGLE, m, seed=1)
    assert jit.shape == (m, 2)
    assert G.knots_in_domain(jit, TRIANGLE) is jit
    np.testing.assert_array_equal(jit, G.jittered_knots(TRIANGLE, m, seed=1))
    assert TRIANGLE.contains(G.regular_knots(TRIANGLE, 100)).all()


def test_knots_outside_domain_raise_clear_error():
    knots = np.array([[0.5, 0.5], [2.9, 1.9], [-1.0, 0.0]])
    with pytest.raises(DataError, match=r"2 of 3 knots lie outside the domain: #1 \(2.9, 1.9\), #2"):
        G.knots_in_domain(knots, TRIANGLE)


def test_bad_knot_requests():
    with pytest.raises(DataError, match="positive integer"):
        G.regular_knots(UNIT, 0)
    with pytest.raises(DataError, match=r"non-empty \(m, 2\) array"):
        G.knots_in_domain(np.zeros((3, 3)), UNIT)


def test_domain_from_points_hulls():
    pts = np.array([[0, 0], [2, 0], [2, 2], [0, 2], [1, 1.8], [1, 0.2]], dtype=float)
    assert G.domain_from_points(pts).geometry.area == pytest.approx(4.0)
    assert G.domain_from_points(pts, "concave", ratio=0.0).geometry.area <= 4.0
    assert G.domain_from_points(pts[:2], buffer=0.5).geometry.area > 0
    with pytest.raises(DataError, match="zero area"):
        G.domain_from_points(pts[:2])
    with pytest.raises(DataError, match="convex' or 'concave"):
        G.domain_from_points(pts, "alpha")


def test_domain_from_file_reprojects(tmp_path):
    square = shapely.box(5.70, 50.95, 5.76, 50.99)  # lon/lat near the Meuse site
    path = tmp_path / "domain.gpkg"
    gpd.GeoDataFrame(geometry=[square], crs="EPSG:4326").to_file(path)
    domain = G.domain_from_file(path, crs="EPSG:28992")
    assert domain.crs.to_epsg() == 28992
    assert 1.5e7 < domain.geometry.area < 2.5e7  # about 4.2 km × 4.4 km
    back = domain.to_crs("EPSG:4326")
    assert back.geometry.symmetric_difference(square).area < 1e-6 * square.area
    with pytest.raises(DataError, match="cannot read domain file"):
        G.domain_from_file(tmp_path / "missing.gpkg")


def test_bbox_validation():
    with pytest.raises(DataError, match="xmin < xmax"):
        G.domain_from_bbox(1, 0, 0, 1)


def test_prediction_grid_clips_and_places_cells():
    grid = G.prediction_grid(TRIANGLE, 0.1)
    assert grid.mask.shape == (20, 30)
    assert TRIANGLE.contains(grid.points).all()
    assert abs(len(grid.points) - 300) < 20  # triangle area 3 / cell 0.01
    raster = grid.to_raster(np.arange(len(grid.points)))
    assert np.isnan(raster[~grid.mask]).all()
    col, row = ~grid.transform @ tuple(grid.points[0])
    assert raster[int(row), int(col)] == 0
    with pytest.raises(DataError, match="resolution"):
        G.prediction_grid(TRIANGLE, 0.0)


def test_lonlat_projects_to_utm_and_back():
    lonlat = np.array([[5.74, 50.97], [5.76, 50.99]])
    xy, crs = G.to_projected(lonlat, "EPSG:4326")
    assert crs.to_epsg() == 32631
    lon, lat = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform(xy[:, 0], xy[:, 1])
    np.testing.assert_allclose(np.column_stack([lon, lat]), lonlat, atol=1e-9)
    assert G.utm_crs([-70.6], [-33.4]).to_epsg() == 32719  # southern hemisphere
    xy2, crs2 = G.to_projected(lonlat, "EPSG:4326", "EPSG:28992")
    assert crs2.to_epsg() == 28992 and np.all(xy2[:, 0] > 1e5)


def test_projected_and_planar_coordinates_are_kept():
    xy = np.array([[181072.0, 333611.0]])
    kept, crs = G.to_projected(xy, "EPSG:28992")
    assert kept is xy and crs.to_epsg() == 28992
    assert G.to_projected(xy, None) == (xy, None)
    with pytest.raises(DataError, match="no CRS"):
        G.to_projected(xy, None, "EPSG:28992")


def test_crs_errors():
    with pytest.raises(DataError, match="unknown CRS 'EPSG:999999'"):
        G.parse_crs("EPSG:999999")
    with pytest.raises(DataError, match="outside lon"):
        G.to_projected(np.array([[181072.0, 333611.0]]), "EPSG:4326")
    with pytest.raises(DataError, match="geographic"):
        G.to_projected(np.array([[181072.0, 333611.0]]), "EPSG:28992", "EPSG:4326")
    assert G.crs_string("EPSG:28992") == "EPSG:28992" and G.crs_string(None) is None
