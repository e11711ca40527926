"""GIS conventions (issue 17) and coordinate validation (issue 15): lon/lat without a CRS refused, wide lon/lat
projected to a centred equal-area CRS, short CRS names, hull domains, absurd coordinates refused quickly."""

import time

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely
import zarr
from pyproj import CRS, Geod, Transformer

from spatialfed.data import geometry as G
from spatialfed.data.ingest import ingest_frame
from spatialfed.errors import DataError

GEOD = Geod(ellps="WGS84")


def continental(n=120, seed=1):
    """Stations spread over the contiguous USA (UTM zones 11 to 18)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"lon": rng.uniform(-120, -75, n), "lat": rng.uniform(30, 47, n), "z": rng.normal(size=n)})


# ---------------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("scale", [1e300, 1e200, 1e13])
def test_huge_coordinates_are_refused_quickly_everywhere(scale, tmp_path):
    rng = np.random.default_rng(0)
    pts = rng.uniform(0, 1, (60, 2)) * scale
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"beyond ±1e\+12 map units.*check the x/y columns and their units"):
        G.check_coordinates(pts)
    with pytest.raises(DataError, match="beyond"):
        G.domain_from_bbox(*pts.min(axis=0), *pts.max(axis=0))
    with pytest.raises(DataError, match="beyond"):
        G.hull_domain(pts)
    frame = pd.DataFrame({"x": pts[:, 0], "y": pts[:, 1], "z": rng.normal(size=60)})
    with pytest.raises(DataError, match="beyond"):
        ingest_frame(frame, tmp_path / "s.zarr", value="z", x="x", y="y", n_workers=2)
    assert not (tmp_path / "s.zarr").exists()
    assert time.perf_counter() - start < 5.0


def test_knot_layout_on_a_thin_or_absurd_domain_ends_with_a_message():
    """A vertical line of points used to loop ~10⁹ times in the knot-grid search (issue 15)."""
    pts = np.column_stack([np.full(50, 3.0), np.linspace(0, 1, 50)])
    info = type("Info", (), {"crs": None, "truth": None})()
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"strip.*collinear.*\(domain=\.\.\.\)"):
        G.jittered_knots(G.store_domain(info, lambda: [[*pts.min(0), *pts.max(0)]]), 25)
    strip = G.Domain(shapely.box(0, 0, 1e-7, 1))
    for build in (G.jittered_knots, G.regular_knots):
        with pytest.raises(DataError, match="strip"):
            build(strip, 25)
    with pytest.raises(DataError, match="zero area"):
        G.jittered_knots(G.Domain(shapely.Polygon([(0, 0), (1, 1), (2, 2)])), 4)
    with pytest.raises(DataError, match="not finite"):
        G.prediction_grid(G.Domain(shapely.box(0, 0, 1e300, 1e300)), 1.0)
    with pytest.raises(DataError, match="fills only"):
        G.jittered_knots(G.Domain(shapely.Polygon([(0, 0), (1000, 1000), (1000, 1000.5)])), 10)
    assert time.perf_counter() - start < 5.0


def test_ordinary_domains_still_get_their_knots_fast():
    start = time.perf_counter()
    for domain in (G.domain_from_bbox(0, 0, 1, 1), G.domain_from_bbox(0, 0, 3, 1), G.Domain(
            shapely.Polygon([(0, 0), (3, 0), (0, 2)]))):
        for m in (1, 9, 100, 400):
            assert G.jittered_knots(domain, m, seed=1).shape == (m, 2)
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize("points, message", [
    (np.array([[0.0, 1.0], [np.nan, 2.0], [3.0, np.inf]]), r"2 of 3 coordinates are NaN or infinite \(e.g. row 1"),
    (np.ones((30, 2)) * [5.0, 7.0], r"only 1 distinct location\(s\) among 30 coordinates, fewer than the 3 needed"),
    (np.array([[0.0, 0.0], [1e-9, 0.0], [0.0, 1e-9]]), r"span only 1e-09 map units.*rescale"),
    (np.array([[1e11, 0.0], [1e11 + 1e-5, 0.0], [1e11, 1e-5]]), "near the rounding error.*offset"),
    (np.zeros((3, 3)), r"must be an \(n, 2\) array"),
])
def test_check_coordinates_names_cause_and_fix(points, message):
    with pytest.raises(DataError, match=message):
        G.check_coordinates(points, min_distinct=3)


def test_all_points_at_one_location_or_too_few_are_refused_at_ingest(tmp_path):
    frame = pd.DataFrame({"x": [10.0] * 20, "y": [20.0] * 20, "z": np.arange(20.0)})
    with pytest.raises(DataError, match=r"only 1 distinct location\(s\) among 20 .* 4 parameters"):
        ingest_frame(frame, tmp_path / "s.zarr", value="z", x="x", y="y", n_workers=2, duplicates="keep")
    assert not (tmp_path / "s.zarr").exists()


# ---------------------------------------------------------------------------------------------------- CRS


@pytest.mark.parametrize("names", [("lon", "lat"), ("x", "y"), ("Longitude", "Latitude")])
def test_lonlat_without_crs_is_refused_with_the_fix(tmp_path, names):
    frame = continental().rename(columns={"lon": names[0], "lat": names[1]})
    with pytest.raises(DataError, match=r"look like longitude/latitude but no CRS was given; pass crs='EPSG:4326'"):
        ingest_frame(frame, tmp_path / "s.zarr", value="z", x=names[0], y=names[1], n_workers=2)
    assert not (tmp_path / "s.zarr").exists()


def test_planar_data_without_crs_is_kept():
    assert not G.looks_geographic([181072.0, 181500.0], [333611.0, 333000.0])   # beyond lon/lat ranges
    assert not G.looks_geographic([0.1, 0.9], [0.2, 0.5], ("x", "y"))            # the unit square of simulations
    assert G.looks_geographic([0.1, 0.9], [0.2, 0.5], ("lon", "lat"))
    assert G.looks_geographic([5.7, 5.8], [50.9, 51.0])
    assert G.parse_crs("planar") is None and G.parse_crs("None") is None


def test_lonlat_spanning_several_utm_zones_gets_a_centred_equal_area_projection(tmp_path):
    frame = continental()
    info, report = ingest_frame(frame, tmp_path / "s.zarr", value="z", x="lon", y="lat", crs="EPSG:4326",
                                n_workers=2)
    crs = CRS.from_user_input(info.crs)
    assert crs.is_projected and crs.coordinate_operation.method_name == "Lambert Azimuthal Equal Area"
    lon0, lat0 = (frame.lon.min() + frame.lon.max()) / 2, (frame.lat.min() + frame.lat.max()) / 2
    assert G.crs_name(info.crs) == f"WGS 84 / LAEA centred {lat0:.2f}N {-lon0:.2f}W"   # the data's centre
    note = next(line for line in report.lines() if "UTM zones" in line)
    assert note.startswith("lon/lat spans UTM zones 11 to 18: a Lambert azimuthal equal-area projection")
    assert "areas exact" in note and "distances within" in note
    assert sum(len(line) for line in report.lines()) < 800 and not any("PROJCRS" in line for line in report.lines())
    # the westmost-to-eastmost distance: within 1% of the ellipsoidal distance, and 3× closer than one UTM zone
    lonlat = frame[["lon", "lat"]].to_numpy()
    west, east = lonlat[np.argmin(lonlat[:, 0])], lonlat[np.argmax(lonlat[:, 0])]
    true = GEOD.inv(west[0], west[1], east[0], east[1])[2]
    errors = []
    for target in (crs, G.utm_crs(lonlat[:, 0], lonlat[:, 1])):
        (x0, x1), (y0, y1) = Transformer.from_crs(4326, target, always_xy=True).transform(
            [west[0], east[0]], [west[1], east[1]])
        errors.append(abs(np.hypot(x1 - x0, y1 - y0) / true - 1))
    assert errors[0] < 0.01 and errors[1] > 3 * errors[0]


def test_one_zone_lonlat_still_goes_to_utm_and_the_note_says_so():
    xy, crs, note = G.project(np.array([[5.74, 50.97], [5.76, 50.99]]), "EPSG:4326")
    assert crs.to_epsg() == 32631 and note.startswith("lon/lat lie in UTM zone 31: projected to EPSG:32631")


def test_projection_across_the_antimeridian_is_centred_on_the_data():
    lon, lat = np.array([178.0, 179.5, -179.5, -177.0]), np.array([-18.0, -16.0, -17.0, -19.0])
    crs, note = G.lonlat_projection(lon, lat)
    assert "UTM zones 60 to 1" in note
    centre = crs.coordinate_operation.params
    lon0 = next(p.value for p in centre if "longitude" in p.name.lower())
    assert abs(((lon0 - 180.5) + 180) % 360 - 180) < 1e-9


def test_crs_short_names_never_print_wkt():
    esri_wkt = CRS.from_user_input("ESRI:102003").to_wkt(version="WKT1_ESRI")
    assert G.crs_name("EPSG:28992") == "EPSG:28992" and G.crs_name(None) is None
    assert G.crs_name(esri_wkt) in ("ESRI:102003", "USA_Contiguous_Albers_Equal_Area_Conic")
    assert G.crs_name("ESRI:102003") == "ESRI:102003" and G.crs_string("ESRI:102003") == "ESRI:102003"
    assert G.crs_name("+proj=laea +lat_0=10 +lon_0=20 +datum=WGS84 +units=m").startswith("+proj=laea")
    laea = G.laea_crs(-88.27, 40.62)
    assert G.crs_name(laea) == "WGS 84 / LAEA centred 40.62N 88.27W"
    assert CRS.from_user_input(G.crs_string(laea)) == laea      # stored as WKT, read back exactly


# ---------------------------------------------------------------------------------------------------- hulls


def l_shaped_points(seed=0):
    """Points on a 40 m lattice filling an L (the square 0–1000 without its upper-right quarter), jittered."""
    g = np.arange(20.0, 1000, 40)
    xx, yy = np.meshgrid(g, g)
    pts = np.column_stack([xx.ravel(), yy.ravel()])
    pts = pts[~((pts[:, 0] > 500) & (pts[:, 1] > 500))]
    return pts + np.random.default_rng(seed).uniform(-5, 5, pts.shape)


def test_hull_domain_leaves_out_empty_corners_and_keeps_every_point():
    pts = l_shaped_points()
    hull = G.hull_domain(pts, "EPSG:28992")
    assert hull.contains(pts).all() and hull.crs.to_epsg() == 28992
    assert not hull.contains([[800.0, 800.0]]).any()                     # the empty quarter
    quarter = shapely.box(560, 560, 1000, 1000)                           # the empty quarter, 40 m in from the L
    assert hull.geometry.intersection(quarter).area < 0.05 * quarter.area
    assert hull.geometry.area < 0.85 * shapely.box(*hull.geometry.bounds).area
    assert G.spacing(pts) == pytest.approx(40, rel=0.2)
    convex = G.hull_domain(pts, ratio=1.0)
    assert convex.geometry.area > hull.geometry.area                     # ratio 1 is the convex hull
    assert G.jittered_knots(hull, 30, seed=0).shape == (30, 2)


def test_union_of_per_worker_hulls_is_the_same_region():
    pts = l_shaped_points()
    left, right = pts[pts[:, 0] <= 500], pts[pts[:, 0] > 500]
    parts = [shapely.to_wkb(G.points_hull(p, buffer=40.0)) for p in (left, right)]
    union = G.domain_from_hulls(parts, "EPSG:28992", close=20.0)
    assert union.contains(pts).all() and not union.contains([[800.0, 800.0]]).any()
    assert union.geometry.geom_type == "Polygon"                          # adjacent hulls merged into one region
    with pytest.raises(DataError, match="no worker hulls"):
        G.domain_from_hulls([])


def test_hull_needs_two_points_or_a_buffer():
    with pytest.raises(DataError, match="fewer than the 2 needed to measure their spacing"):
        G.hull_domain([[1.0, 2.0]])
    assert G.hull_domain([[1.0, 2.0]], buffer=5.0).geometry.area == pytest.approx(np.pi * 25, rel=0.02)
    with pytest.raises(DataError, match="ratio must be in"):
        G.hull_domain(l_shaped_points(), ratio=0.0)


def test_store_hull_domain_is_the_unit_square_for_simulations_else_the_hull_of_the_sites_hulls():
    pts = l_shaped_points()
    sim = type("Info", (), {"crs": None, "truth": {"beta": 0.1}})()
    assert G.store_hull_domain(sim, lambda: 1 / 0).geometry.equals(shapely.box(0, 0, 1, 1))  # hulls never asked
    real = type("Info", (), {"crs": "EPSG:28992", "truth": None})()
    pts = pts[np.abs(pts[:, 0] - 500) > 80]  # a gap wider than the sites' spacing (the hulls' buffer) at x = 500
    halves = [G.points_hull(pts[pts[:, 0] < 500]), G.points_hull(pts[pts[:, 0] > 500])]
    dom = G.store_hull_domain(real, lambda: halves)
    assert dom.crs.to_epsg() == 28992 and dom.contains(pts).all()
    assert not shapely.union_all(halves).contains(shapely.Point(500.0, 250.0))  # the union's slit ...
    assert dom.contains([[500.0, 250.0], [700.0, 700.0]]).all()  # ... and the L's notch below its diagonal are in
    assert not dom.contains([[900.0, 900.0]]).any()  # the notch beyond the diagonal is not
    box = G.store_hull_domain(real, lambda: halves, kind="bbox")
    assert box.geometry.equals(shapely.box(*dom.geometry.bounds))


def test_geodataframe_points_without_crs_that_look_like_lonlat_are_refused(tmp_path):
    frame = continental()
    geo = gpd.GeoDataFrame(frame[["z"]], geometry=gpd.points_from_xy(frame.lon, frame.lat))   # no CRS
    with pytest.raises(DataError, match=r"\(geometry x, geometry y\) look like longitude/latitude"):
        ingest_frame(geo, tmp_path / "s.zarr", value="z", n_workers=2)
    ingest_frame(geo.set_crs(4326), tmp_path / "s.zarr", value="z", n_workers=2)
    assert zarr.open_group(tmp_path / "s.zarr", mode="r").attrs["crs_note"].startswith("lon/lat spans UTM zones 11")


def test_scale_error_of_a_large_point_set_is_found_from_a_sample_and_the_extremes():
    rng = np.random.default_rng(2)
    lon, lat = rng.uniform(-120, -75, 60_000), rng.uniform(30, 47, 60_000)
    crs = G.laea_crs(*G.lonlat_centre(lon, lat))
    full = G.scale_error(crs, lon, lat, max_points=10**9)
    assert G.scale_error(crs, lon, lat, max_points=2_000) == pytest.approx(full, rel=0.02)
    assert 0.005 < full < 0.02                                           # LAEA over the contiguous USA: ~1.2%
