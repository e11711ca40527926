"""benchmarks/bench_large.py's figure (issue 14): predictions saved as .npz, the figure redrawn from it alone.

Synthetic arrays on a small regular lon/lat grid stand in for the Heaton field (no fit, no data files)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_large as bl  # noqa: E402

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")


def synthetic(nx=40, ny=24, seed=0):
    """A smooth field on an nx × ny grid of 0.01°, a block of held-out cells, two methods' predictions, 4 owners."""
    rng = np.random.default_rng(seed)
    lon, lat = np.meshgrid(-95.9 + 0.01 * np.arange(nx), 34.3 + 0.01 * np.arange(ny))
    z = 40 + 3 * np.sin(lon * 20) + 2 * np.cos(lat * 15) + 0.2 * rng.standard_normal(lon.shape)
    held = (np.abs(lon - lon.mean()) < 0.1) & (np.abs(lat - lat.mean()) < 0.06)
    frame = pd.DataFrame({"Lon": lon.ravel(), "Lat": lat.ravel(), "temp": z.ravel()})
    train, test = frame[~held.ravel()].reset_index(drop=True), frame[held.ravel()].reset_index(drop=True)
    n = len(test)
    owner = (test["Lon"].to_numpy() > lon.mean()).astype(int) + 2 * (test["Lat"].to_numpy() > lat.mean())
    sf_row = {"method": "spatialfed", "J": 4, "residual": "full", "fit_s": 30.0, "predict_s": 5.0, "rmse": 0.30,
              "mae": 0.24, "crps": 0.17, "coverage95": 0.951}
    gp_row = {"method": "gpboost_vecchia20", "J": None, "residual": None, "fit_s": 20.0, "predict_s": 2.0,
              "rmse": 0.32, "mae": 0.25, "crps": 0.18, "coverage95": 0.962}
    runs = [(sf_row, {"mean": test["temp"].to_numpy() + 0.3 * rng.standard_normal(n), "sd": 0.3 + 0.1 * rng.random(n),
                      "owner": owner.astype(np.int32)}),
            (gp_row, {"mean": test["temp"].to_numpy() + 0.32 * rng.standard_normal(n), "sd": np.full(n, 0.33)})]
    return train, test, runs


META = {"data": "synthetic", "subsample": None, "seed": 0, "commit": "abc1234", "date": "2026-11-24 02:00 UTC"}


def test_save_load_roundtrip(tmp_path):
    train, test, runs = synthetic()
    npz = bl.save_predictions(tmp_path / "p.npz", train, test, runs, META)
    got = bl.load_predictions(npz)
    assert [r["method"] for r in got["rows"]] == ["spatialfed", "gpboost_vecchia20"]
    assert got["meta"]["commit"] == "abc1234"
    np.testing.assert_allclose(got["test_z"], test["temp"].to_numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(got["methods"]["spatialfed_J4_full"]["mean"], runs[0][1]["mean"], rtol=0, atol=0)
    np.testing.assert_array_equal(got["methods"]["spatialfed_J4_full"]["owner"], runs[0][1]["owner"])
    assert set(got["methods"]["gpboost_vecchia20"]) == {"mean", "sd"}
    assert [p.name for p in tmp_path.iterdir()] == ["p.npz"]  # atomic: no temporary left beside it


def test_figure_written_and_drawn(tmp_path):
    from matplotlib.image import imread

    train, test, runs = synthetic()
    npz = bl.save_predictions(tmp_path / "p.npz", train, test, runs, META)
    out = bl.plot_heaton(bl.load_predictions(npz), tmp_path / "fig.png", dpi=40)
    assert out == tmp_path / "fig.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = imread(out)
    assert img.shape[:2] == (460, 680)  # 11.5 x 17 in at 40 dpi
    # the maps are drawn: a viridis/magma/RdBu figure has many distinct colours (a blank or text-only one has few)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "p.npz"]


def test_the_panels_show_the_predictions():
    """What is drawn, not only that a file exists: each map panel's image holds its method's values on the held-out
    cells, the three temperature maps share one colour scale, the owner boundaries are drawn, the scores are the
    rows'."""
    train, test, runs = synthetic()
    pred = {"train_lonlat": train[["Lon", "Lat"]].to_numpy(), "train_z": train["temp"].to_numpy(),
            "test_lonlat": test[["Lon", "Lat"]].to_numpy(), "test_z": test["temp"].to_numpy(),
            "rows": [r for r, _ in runs], "meta": META,
            "methods": {bl.method_key(r): kept for r, kept in runs}}
    fig = bl.heaton_figure(pred)
    axes = {a.get_title().split("\n")[0]: a for a in fig.axes if a.get_title()}
    grid = bl.regular_grid(np.vstack([pred["train_lonlat"], pred["test_lonlat"]]))
    at = tuple(np.round((pred["test_lonlat"][:, k] - grid[k]) / grid[2 + k]).astype(int) for k in (1, 0))

    def shown(title):
        image = axes[title].get_images()[-1]
        return np.ma.filled(image.get_array().astype(float), np.nan), image.get_clim()

    sf, gp = runs[0][1]["mean"], runs[1][1]["mean"]
    z = pred["test_z"]
    for title, want in [("held-out truth (240 cells; grey: training)", z),
                        ("spatialfed J=4 full: predicted mean", sf), ("GPBoost Vecchia-20: predicted mean", gp),
                        ("spatialfed J=4 full: predictive sd (new obs.)", runs[0][1]["sd"]),
                        ("spatialfed J=4 full: mean − truth", sf - z),
                        ("spatialfed J=4 full − GPBoost: means", sf - gp)]:
        values, _ = shown(title)
        np.testing.assert_allclose(values[at], want, rtol=1e-12, atol=1e-12, err_msg=title)
        assert np.isnan(values).sum() == values.size - len(z)  # nothing drawn off the held-out cells
    clims = {shown(t)[1] for t in ("held-out truth (240 cells; grey: training)", "spatialfed J=4 full: predicted mean",
                                   "GPBoost Vecchia-20: predicted mean")}
    assert len(clims) == 1  # one colour scale for the truth and both means
    lines = axes["spatialfed J=4 full: predictive sd (new obs.)"].collections[-1]
    assert len(lines.get_segments()) > 0
    rmse_dots = axes["RMSE (°C) on the held-out cells, lower is better"].collections[-1].get_offsets()
    np.testing.assert_allclose(np.asarray(rmse_dots)[:, 0], [0.30, 0.32], rtol=0, atol=1e-12)


def test_replot_from_the_command_line(tmp_path, capsys):
    train, test, runs = synthetic()
    npz = bl.save_predictions(tmp_path / "p.npz", train, test, runs, META)
    bl.main(["--replot", str(npz), "--figure", str(tmp_path / "again.pdf"), "--figure-fit", "J4-full"])
    assert (tmp_path / "again.pdf").read_bytes()[:5] == b"%PDF-"
    assert capsys.readouterr().out == ""  # stdout is the JSON rows' channel: a replot prints none


def test_only_one_method_and_scattered_points(tmp_path):
    """--no-gpboost runs give a figure with the GPBoost panels marked missing; off-grid points fall back to dots."""
    train, test, runs = synthetic()
    rng = np.random.default_rng(1)
    train = train.assign(Lon=train["Lon"] + 1e-3 * rng.random(len(train)))
    assert bl.regular_grid(np.c_[train["Lon"], train["Lat"]]) is None
    npz = bl.save_predictions(tmp_path / "p.npz", train, test, runs[:1], META)
    assert bl.plot_heaton(bl.load_predictions(npz), tmp_path / "one.png", dpi=30).stat().st_size > 10_000


def test_raster_and_owner_boundaries():
    grid = bl.regular_grid(np.array([[0.0, 10.0], [0.5, 10.0], [1.0, 11.0], [0.0, 11.0]]))
    assert grid == (0.0, 10.0, 0.5, 1.0, 3, 2)
    owner = np.array([[0, 0, 1], [0, 2, -1]])
    r = bl.rasterize(np.array([[1.0, 11.0], [0.0, 10.0]]), np.array([7.0, 3.0]), grid)
    assert r[1, 2] == 7.0 and r[0, 0] == 3.0 and np.isnan(r).sum() == 4
    segs = bl.owner_edges(owner, grid)
    # vertical edges: (row 0, between x=0.5 and 1.0) and (row 1, between 0 and 0.5); horizontal: column 1 (0 | 2);
    # no edge to the -1 (no owner) cell
    want = {((0.75, 9.5), (0.75, 10.5)), ((0.25, 10.5), (0.25, 11.5)), ((0.25, 10.5), (0.75, 10.5))}
    assert {tuple(map(tuple, np.round(s, 9))) for s in segs} == want


def test_errors_are_one_line(tmp_path):
    train, test, runs = synthetic()
    npz = bl.save_predictions(tmp_path / "p.npz", train, test, runs, META)
    with pytest.raises(SystemExit, match="no spatialfed run J9-pp.*J4-full"):
        bl.plot_heaton(bl.load_predictions(npz), tmp_path / "x.png", fit="J9-pp")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files if k != "gpboost_vecchia20__sd"}
    np.savez(tmp_path / "broken.npz", **arrays)
    with pytest.raises(SystemExit, match="gpboost_vecchia20__sd"):
        bl.load_predictions(tmp_path / "broken.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(SystemExit, match="cannot read predictions"):
        bl.load_predictions(tmp_path / "junk.npz")
    with pytest.raises(SystemExit, match="give --figure one of these suffixes"):
        bl.plot_heaton(bl.load_predictions(npz), tmp_path / "x.docx")
    with pytest.raises(SystemExit, match="inside the repository"):
        bl.check_outside_repo(REPO / "docs" / "x.npz", "--predictions")
    with pytest.raises(SystemExit):  # --replot without --figure: argparse's one-line usage error
        bl.main(["--replot", str(npz)])
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.docx").exists()
    assert json.loads(str(np.load(npz)["rows"]))[0]["J"] == 4


def test_subsample_keeps_every_held_out_cell_with_all_test(tmp_path):
    train, test, _ = synthetic()
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    tr, te = bl.load(tmp_path, 300, seed=0)
    assert len(tr) == 300 and len(te) == round(300 * len(test) / len(train))
    tr2, te2 = bl.load(tmp_path, 300, seed=0, keep_test=True)
    assert tr2.equals(tr) and te2.equals(test)
