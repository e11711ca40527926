"""Bad inputs are refused cleanly (issue 15): every case below, through the real command line (`spatialfed.cli.main`,
a few through `python -m spatialfed` in a subprocess) or the Python API (`spatialfed.api.FederatedGP` and the data
functions), must

- end with exit status ≠ 0 (the API: raise SpatialFedError / ValueError / OSError),
- print one error line on stderr that names the cause (a regex per case), never a traceback,
- leave nothing behind: the case's directory holds exactly what it held before (no output, no ``*.tmp*`` staging
  file or directory), and an output path that existed before is unchanged.

Usage errors caught by argparse (unknown command, choice or malformed number) exit 2 after the usage lines; their
error line is still the only one naming the cause. Everything runs on tiny stores (3 workers × 30 points) and the
simulated runtime; the count of cases is reported in docs/recovery.md ("Bad input").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from spatialfed import Checkpoint, Emulation
from spatialfed.cli import main
from spatialfed.errors import SpatialFedError

FIT = ["--runtime", "simulated", "--knots", "9", "--max-iter", "3", "--quiet"]  # a fast fit on the tiny store
PRED = ["--runtime", "simulated"]
SIM = ["simulate", "{T}/out.zarr", "--quiet"]
J3 = ["--workers", "3", "--n-per-worker", "30"]
MAPCOV = [*PRED, "--covariates", "{D}/cov_grid.csv"]  # the simulated store's covariates, on a grid over [0,1]²


# --- the world the cases run in -------------------------------------------------------------------------------------

def _csv(path: Path, header: str, rows) -> str:
    path.write_text(header + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return str(path)


def _good_rows(n=40, seed=0):
    """Planar coordinates (metres, clearly not lon/lat), a value z, two covariates and a group label."""
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(1000, 2000, n), rng.uniform(5000, 6000, n)
    z, c1, c2 = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    return [[f"{a:.3f}", f"{b:.3f}", f"{c:.4f}", f"{d:.4f}", f"{e:.4f}", "abc"[i % 3]]
            for i, (a, b, c, d, e) in enumerate(zip(x, y, z, c1, c2))]


HEADER = "x,y,z,c1,c2,g"


def _with(rows, col: int, value, which=None):
    """A copy of `rows` with column `col` set to `value` in the rows `which` (all by default)."""
    out = [list(r) for r in rows]
    for i, r in enumerate(out):
        if which is None or i in which:
            r[col] = value(i) if callable(value) else value
    return out


def _write_data(d: Path) -> None:
    """The CSV and vector files of the ingest, predict and map cases."""
    d.mkdir()
    rows = _good_rows()
    _csv(d / "good.csv", HEADER, rows)
    _csv(d / "nocoords.csv", HEADER.replace("x,y,", "east,north,", 1), rows)  # columns no name detection knows
    for name, col in (("z", 2), ("x", 0), ("y", 1), ("c1", 3)):
        _csv(d / f"nan_{name}.csv", HEADER, _with(rows, col, "nan"))
        _csv(d / f"inf_{name}.csv", HEADER, _with(rows, col, "inf"))
    _csv(d / "neginf_z.csv", HEADER, _with(rows, 2, "-inf"))
    _csv(d / "blank_z.csv", HEADER, _with(rows, 2, ""))
    (d / "empty.csv").write_text("")
    (d / "header_only.csv").write_text(HEADER + "\n")
    (d / "semicolon.csv").write_text(HEADER.replace(",", ";") + "\n"
                                     + "".join(";".join(r) + "\n" for r in rows))
    (d / "tabs.csv").write_text(HEADER.replace(",", "\t") + "\n" + "".join("\t".join(r) + "\n" for r in rows))
    _csv(d / "text_z.csv", HEADER, _with(rows, 2, "high", which={3, 7}))
    _csv(d / "text_x.csv", HEADER, _with(rows, 0, "12o4.5", which={5}))
    _csv(d / "text_c1.csv", HEADER, _with(rows, 3, "n/a?", which={1}))
    _csv(d / "dup_cols.csv", "x,y,z,c1,c1,g", rows)
    _csv(d / "dup_z.csv", "x,y,z,z,c2,g", rows)
    _csv(d / "huge.csv", HEADER, _with(rows, 0, lambda i: f"{1e300 * (i + 1):.6g}"))
    _csv(d / "huge_y.csv", HEADER, _with(rows, 1, lambda i: f"{-3e200 * (i + 1):.6g}"))
    _csv(d / "absurd_z.csv", HEADER, _with(rows, 2, "1e308", which={6}))  # one missing-value code
    _csv(d / "absurd_c1.csv", HEADER, _with(rows, 3, "-1e308", which={9}))
    _csv(d / "one_place.csv", HEADER, _with(_with(rows, 0, "1500.0"), 1, "5500.0"))
    _csv(d / "collinear.csv", HEADER, _with(rows, 1, "5500.0"))                      # a horizontal line
    _csv(d / "tiny_extent.csv", HEADER, [[f"{1500 + i * 1e-9:.12f}", f"{5500 + (i % 7) * 1e-9:.12f}", *r[2:]]
                                         for i, r in enumerate(rows)])
    lonlat = [[f"{5.0 + float(r[0]) / 4000:.5f}", f"{51.0 + float(r[1]) / 12000:.5f}", *r[2:]] for r in rows]
    _csv(d / "lonlat.csv", HEADER, lonlat)
    _csv(d / "few.csv", HEADER, rows[:4])
    for k in (1, 5):  # a site (group "d") of k rows: its start-pass moments would nearly give its values
        _csv(d / f"site_of_{k}.csv", HEADER, _with(rows, 5, "d", which=set(range(k))))
    _csv(d / "const_z.csv", HEADER, _with(rows, 2, "3.25"))
    _csv(d / "dups.csv", HEADER, rows + rows[:3])
    # prediction locations and map covariates
    rng = np.random.default_rng(5)
    pts = rng.uniform(0.05, 0.95, (8, 2))
    _csv(d / "locs_nocov.csv", "x,y", [[f"{a:.4f}", f"{b:.4f}"] for a, b in pts])
    _csv(d / "locs_somecov.csv", "x,y,x1,x2", [[f"{a:.4f}", f"{b:.4f}", 0.1, 0.2] for a, b in pts])
    _csv(d / "locs_nan.csv", "x,y,x1,x2,x3,x4,x5", [[f"{a:.4f}", "nan" if i == 2 else f"{b:.4f}", 0, 0, 0, 0, 0]
                                                      for i, (a, b) in enumerate(pts)])
    _csv(d / "locs_text.csv", "x,y,x1,x2,x3,x4,x5", [[f"{a:.4f}", f"{b:.4f}", "low", 0, 0, 0, 0] for a, b in pts])
    (d / "locs_empty.csv").write_text("x,y,x1,x2,x3,x4,x5\n")
    _csv(d / "knots_outside.csv", "X,Y", [[0.2, 0.2], [0.8, 0.2], [0.5, 0.8], [1.5, 0.5]])
    _csv(d / "knots_dup.csv", "lon,lat", [[0.2, 0.2], [0.8, 0.2], [0.5, 0.8], [0.8, 0.2]])
    _csv(d / "knots_ab.csv", "a,b", [[0.2, 0.2], [0.8, 0.2], [0.5, 0.8]])
    g = np.linspace(0.0, 1.0, 41)
    _csv(d / "cov_grid.csv", "x,y,x1,x2,x3,x4,x5", [[f"{a:.4f}", f"{b:.4f}", 0, 0, 0, 0, 0] for a in g for b in g])
    # vector files that are not a polygon domain
    line = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "LineString", "coordinates": [[0, 0], [1, 1]]}}]}
    points = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "Point", "coordinates": [0.5, 0.5]}}]}
    (d / "line.geojson").write_text(json.dumps(line))
    (d / "points.geojson").write_text(json.dumps(points))
    (d / "garbage.geojson").write_text("{ this is not json")
    (d / "not_a_domain.txt").write_text("hello\n")


def _damage(src: Path, dst: Path, how: str) -> str:
    """A copy of store `src` at `dst` with a deleted chunk, a corrupted chunk or a missing worker group."""
    shutil.copytree(src, dst)
    chunk = dst / "workers" / "1" / "z" / "c" / "0"
    if how == "deleted":
        chunk.unlink()
    elif how == "corrupted":
        data = bytearray(chunk.read_bytes())
        for i in range(8, len(data), 7):
            data[i] ^= 0x5A
        chunk.write_bytes(bytes(data))
    elif how == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:5])
    elif how == "no_group":
        shutil.rmtree(dst / "workers" / "2")
    elif how == "no_root":
        (dst / "zarr.json").unlink()
    elif how == "bad_root_json":
        (dst / "zarr.json").write_text("{ not json")
    elif how in ("bad_group_json", "bad_array_json"):  # cut short inside a string, as a crash mid-write leaves it
        meta = dst.joinpath("workers", "1", *(("z",) if how == "bad_array_json" else ()), "zarr.json")
        meta.write_bytes(meta.read_bytes()[:30])
    return str(dst)


def _store(path: Path, parts, names=("intercept", "c1"), **attrs) -> str:
    """A store written with zarr directly (bypassing write_store's checks), in the SPEC §5 layout (no checksums:
    as an older spatialfed or another tool would write it); `attrs` added to the root's."""
    import zarr

    root = zarr.open_group(path, mode="w")
    workers = root.create_group("workers")
    for j, (locs, z, X) in enumerate(parts):
        g = workers.create_group(str(j))
        for name, arr in (("locs", locs), ("z", z), ("X", X)):
            g.create_array(name, data=np.ascontiguousarray(arr, dtype=float))
    root.attrs.update(spatialfed_format=1, n_workers=len(parts), partition="random", crs=None,
                      covariate_names=list(names), **attrs)
    return str(path)


def _parts(locs, z=None, seed=3, J=3):
    """J partitions of the given locations with covariates [1, c1] and a value z (random when None)."""
    rng = np.random.default_rng(seed)
    locs = np.asarray(locs, dtype=float)
    n = len(locs)
    z = rng.normal(size=n) if z is None else np.broadcast_to(np.asarray(z, dtype=float), (n,)).copy()
    X = np.column_stack([np.ones(n), rng.normal(size=n)])
    idx = np.array_split(np.arange(n), J)
    return [(locs[i], z[i], X[i]) for i in idx]


def _bad_tls(d: Path) -> str:
    d.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (d / name).write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all!!\n-----END CERTIFICATE-----\n")
    return str(d)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Paths every case may refer to (by the names used in the argv templates)."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.simulate import simulate_store

    base = tmp_path_factory.mktemp("bad_input")
    w = {"base": str(base)}
    S, O = base / "s.zarr", base / "o.zarr"
    simulate_store(S, 3, 30, test_size=10, seed=0, progress=False)
    simulate_store(O, 3, 30, test_size=10, seed=1, progress=False)
    w["S"], w["O"] = str(S), str(O)
    F = base / "fit"
    FederatedGP(cluster="simulated", knots=9, max_iter=3, progress=False).fit(S).save(F)
    w["F"] = str(F)
    nofit = base / "fit_nojson"
    shutil.copytree(F, nofit)
    (nofit / "fit.json").unlink()
    w["NOFIT"] = str(nofit)
    badfit = base / "fit_badjson"
    shutil.copytree(F, badfit)
    (badfit / "fit.json").write_text('{"method": "lowrank", ')
    w["BADFIT"] = str(badfit)
    CK = base / "ck"
    FederatedGP(cluster="simulated", knots=9, max_iter=3, progress=False,
                checkpoint=Checkpoint(CK / "checkpoint.zip", every=1)).fit(S).save(CK)
    w["CK"] = str(CK)
    for how in ("deleted", "corrupted", "truncated", "no_group", "no_root", "bad_root_json", "bad_group_json",
                "bad_array_json"):
        w[how.upper()] = _damage(S, base / f"{how}.zarr", how)
    from spatialfed.data import crs as crs_module
    from spatialfed.data.store import write_store

    rng = np.random.default_rng(8)  # lon/lat degrees in the Netherlands labelled RD New (metres), as a store
    w["DEGREES"] = str(base / "degrees.zarr")  # written before write_store refused that holds them
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(crs_module, "check_degrees_mislabelled", lambda *args, **kwargs: None)
        write_store(w["DEGREES"], _parts(np.column_stack([rng.uniform(5.6, 5.9, 60), rng.uniform(50.9, 51.1, 60)])),
                    partition="random", crs="EPSG:28992", covariate_names=["intercept", "c1"])
    (base / "file.txt").write_text("a file, not a directory\n")
    w["FILE"] = str(base / "file.txt")
    from spatialfed.data.store import write_store

    rng = np.random.default_rng(3)  # a store not made by ingest, one worker of 5 rows
    write_store(base / "small_site.zarr", [(rng.uniform(0, 1, (n, 2)), rng.normal(size=n), np.ones((n, 1)))
                                           for n in (30, 30, 5)], partition="random", crs=None,
                covariate_names=["intercept"])
    w["SMALLSITE"] = str(base / "small_site.zarr")
    (base / "emptydir").mkdir()
    w["EMPTYDIR"] = str(base / "emptydir")
    w["TLS"] = _bad_tls(base / "tls")
    w["TLSPART"] = str(base / "tls_partial")
    (base / "tls_partial").mkdir()
    (base / "tls_partial" / "ca.pem").write_text("")
    _write_data(base / "data")
    w["D"] = str(base / "data")
    from spatialfed.data.ingest import ingest

    w["LINE"] = str(ingest(base / "data" / "collinear.csv", base / "line.zarr", x="x", y="y", value="z",
                           n_workers=3)[0].path)
    w["listing"] = _listing(base)
    with _tls_scheduler(tmp_path_factory.mktemp("tls_certs")) as address:  # a scheduler that wants TLS
        w["TLSADDR"], w["TCPADDR"] = address, address.replace("tls://", "tcp://")
        yield w


@contextmanager
def _tls_scheduler(cert_dir: Path):
    """The address of a real Dask scheduler (and one in-process worker) requiring TLS with certificates in
    `cert_dir`, as `dask scheduler --tls-ca-file ... --tls-cert ... --tls-key ...` starts one."""
    from distributed import LocalCluster

    from spatialfed.runtime.security import tls_security, write_tls_files

    security = tls_security(write_tls_files(cert_dir))
    with LocalCluster(protocol="tls", host="127.0.0.1", security=security, n_workers=1, threads_per_worker=1,
                      processes=False, dashboard_address=None, silence_logs=50) as cluster:
        yield cluster.scheduler_address


# --- running a case ---------------------------------------------------------------------------------------------------

def _listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _tmp_leftovers(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*") if ".tmp" in p.name]


def _fill(args, world, T):
    return [a.format(T=T, **world) for a in args]


def _prepare(setup, world, T: Path):
    """Per-case setup inside the case's own directory T."""
    if setup == "out_file":
        (T / "out").write_text("keep me\n")
    elif setup == "out_dir":  # an earlier output: a directory that is not empty
        (T / "out").mkdir()
        (T / "out" / "notes.txt").write_text("keep me\n")
    elif setup == "out_csv":
        (T / "out.csv").write_text("x,y,mean\n0,0,1\n")
    elif setup == "metrics_json":  # the scores of an earlier prediction into the same directory
        (T / "out.csv").write_text("x,y,mean\n0,0,1\n")
        (T / "metrics.json").write_text('{"rmse": 1.0}\n')
    elif setup == "ckdir":
        shutil.copytree(world["CK"], T / "ck")
    elif setup == "ck_only":  # a checkpoint without the rest of the fit directory
        (T / "ck").mkdir()
        shutil.copy(Path(world["CK"]) / "checkpoint.zip", T / "ck" / "checkpoint.zip")
    elif setup == "empty_ck":
        (T / "ck").mkdir()
        (T / "ck" / "checkpoint.zip").write_bytes(b"")
    elif setup == "text_ck":
        (T / "ck").mkdir()
        (T / "ck" / "checkpoint.zip").write_text("not a checkpoint")
    elif setup == "nock":
        (T / "ck").mkdir()
        (T / "ck" / "fit.json").write_text("{}")
    elif setup == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root ignores directory permissions (the path-under-a-file cases cover OS errors)")
        (T / "ro").mkdir()
        (T / "ro").chmod(0o555)
    elif setup:
        raise AssertionError(setup)


def run_cli(argv, capsys) -> tuple[int, str]:
    """(exit status, stderr) of `spatialfed ARGV` run in this process."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    return code, capsys.readouterr().err


def check_message(code, err, pattern) -> None:
    """Exit ≠ 0; no traceback; exactly one error line (exit 1: stderr is that line; exit 2: usage lines, then it);
    the error line matches `pattern` (the cause)."""
    assert code not in (0, None), f"exit status {code}, stderr: {err!r}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(^|: )error: ", line)]
    assert len(errors) == 1, f"expected one error line, got: {err!r}"
    if code == 1:
        assert lines == errors, f"stderr is more than the error line: {err!r}"
    else:
        assert code == 2 and lines[-1] == errors[0] and lines[0].startswith("usage:"), (code, err)
    assert re.search(pattern, errors[0], re.IGNORECASE), f"{pattern!r} not in {errors[0]!r}"


# --- the command-line cases -------------------------------------------------------------------------------------------
# (id, argv template, regex naming the cause, per-case setup); {T} is the case's own empty directory, and every
# output goes there: afterwards T must hold exactly what the setup put in it.

#: ingest of the good table into a new store: the prefix of most ingest cases
INGEST_GOOD = ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"]

CLI_CASES = [
    # top level
    ("unknown-subcommand", ["fitt", "{S}"], r"invalid choice: 'fitt'", None),
    ("no-subcommand-option", ["--frobnicate"], r"unrecognized arguments|required|invalid choice", None),
    ("unknown-option", ["fit", "{S}", "--out", "{T}/out", "--knotz", "9"], r"unrecognized arguments: --knotz", None),
    # simulate
    ("simulate-workers-0", [*SIM, "--workers", "0", "--n-per-worker", "30"],
     r"number of workers must be a positive integer, got 0", None),
    ("simulate-workers-neg", [*SIM, "--workers", "-2", "--n-per-worker", "30"],
     r"number of workers must be a positive integer, got -2",
     None),
    ("simulate-no-workers", [*SIM, "--n-per-worker", "30"],
     r"give --workers and --n-per-worker, or --sizes", None),
    ("simulate-n-0", [*SIM, "--workers", "3", "--n-per-worker", "0"],
     r"n_per_worker must be a positive integer, got 0",
     None),
    ("simulate-sizes-0", [*SIM, "--sizes", "30,0,30"], r"every worker needs at least one row", None),
    ("simulate-nu-0", [*SIM, *J3, "--nu", "0"],
     r"smoothness nu must be a finite number > 0, got 0\.0", None),
    ("simulate-nu-nan", [*SIM, *J3, "--nu", "nan"],
     r"smoothness nu must be a finite number > 0, got nan", None),
    ("simulate-beta-0", [*SIM, *J3, "--beta", "0"],
     r"beta must be a finite number > 0, got 0\.0", None),
    ("simulate-sigma2-neg", [*SIM, *J3, "--sigma2", "-1"],
     r"sigma2 must be a finite number > 0, got -1\.0", None),
    ("simulate-noise-0", [*SIM, *J3, "--noise-sd", "0"],
     r"noise_sd must be a finite number > 0, got 0\.0", None),
    ("simulate-test-size-neg", [*SIM, "--workers", "3", "--n-per-worker", "30",
                                "--test-size", "-5"], r"test_size must be a non-negative integer, got -5", None),
    ("simulate-unknown-partition", [*SIM, "--workers", "3", "--n-per-worker", "30",
                                    "--partition", "hexagons"], r"--partition.*invalid choice", None),
    ("simulate-out-exists", ["simulate", "{T}/out", "--quiet", *J3], r"exists", "out_file"),
    ("simulate-out-dir-exists", ["simulate", "{T}/out", "--quiet", *J3],
     r"out already exists; choose another path or pass --overwrite to replace it", "out_dir"),
    ("simulate-out-under-file", ["simulate", "{FILE}/out.zarr", "--quiet", *J3],
     r"not a directory|is a file|file\.txt", None),
    # ingest: the table
    ("ingest-missing-table", ["ingest", "{D}/nope.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"nope\.csv.*(does not exist|not found)", None),
    ("ingest-table-is-dir", ["ingest", "{EMPTYDIR}", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"emptydir is a directory", None),
    ("ingest-empty-file", ["ingest", "{D}/empty.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"empty\.csv: No columns to parse", None),
    ("ingest-header-only", ["ingest", "{D}/header_only.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"header_only\.csv has a header but no data rows", None),
    ("ingest-semicolons", ["ingest", "{D}/semicolon.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"not in the table.*(delimiter|separator|;)", None),
    ("ingest-tabs", ["ingest", "{D}/tabs.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"not in the table.*(delimiter|separator|\\t)", None),
    ("ingest-missing-value-column", ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                     "--value", "height"], r"\['height'\] not in the table", None),
    ("ingest-missing-x-column", ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "lon", "--y", "y", "--value", "z"],
     r"\['lon'\] not in the table", None),
    ("ingest-missing-covariate", [*INGEST_GOOD, "--covariates", "c1,c9"], r"\['c9'\] not in the table", None),
    ("ingest-x-without-y", ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--value", "z"],
     r"both --x and --y", None),
    ("ingest-no-geometry", ["ingest", "{D}/nocoords.csv", "{T}/out.zarr", "--value", "z"],
     r"no geometry and no coordinate columns found by name .*name them with --x and --y; its columns: east, north, z",
     None),
    ("ingest-no-value", ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--y", "y"],
     r"required: --value", None),
    ("ingest-nan-value", ["ingest", "{D}/nan_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has no values", None),
    ("ingest-inf-value", ["ingest", "{D}/inf_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has no values at all", None),
    ("ingest-neginf-value", ["ingest", "{D}/neginf_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has no values at all", None),
    ("ingest-blank-value", ["ingest", "{D}/blank_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has no values", None),
    ("ingest-nan-x", ["ingest", "{D}/nan_x.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'x' has no values", None),
    ("ingest-inf-x", ["ingest", "{D}/inf_x.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'x' has no values at all", None),
    ("ingest-nan-y", ["ingest", "{D}/nan_y.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'y' has no values", None),
    ("ingest-inf-y", ["ingest", "{D}/inf_y.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'y' has no values at all", None),
    ("ingest-nan-covariate", ["ingest", "{D}/nan_c1.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z",
                              "--covariates", "c1"], r"'c1' has no values", None),
    ("ingest-inf-covariate", ["ingest", "{D}/inf_c1.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z",
                              "--covariates", "c1"], r"'c1' has no values at all", None),
    ("ingest-text-value", ["ingest", "{D}/text_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has 2 non-numeric.*'high'", None),
    ("ingest-text-x", ["ingest", "{D}/text_x.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'x' has 1 non-numeric.*12o4\.5", None),
    ("ingest-text-covariate", ["ingest", "{D}/text_c1.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z",
                               "--covariates", "c1"], r"'c1' has 1 non-numeric", None),
    ("ingest-label-column-as-value", ["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                      "--value", "g"], r"'g' has 40 non-numeric", None),
    ("ingest-duplicate-columns", ["ingest", "{D}/dup_cols.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                  "--value", "z", "--covariates", "c1"], r"duplicate column name.*'c1'", None),
    ("ingest-duplicate-value-column", ["ingest", "{D}/dup_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                       "--value", "z"], r"duplicate column name.*'z'", None),
    ("ingest-huge-x", ["ingest", "{D}/huge.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"beyond ±1e\+12", None),
    ("ingest-huge-y", ["ingest", "{D}/huge_y.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"beyond ±1e\+12", None),
    ("ingest-one-location", ["ingest", "{D}/one_place.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z",
                             "--duplicates", "keep"], r"only 1 distinct location", None),
    ("ingest-tiny-extent", ["ingest", "{D}/tiny_extent.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"span only .* map units \(< 1e-06\)", None),
    ("ingest-lonlat-without-crs", ["ingest", "{D}/lonlat.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                   "--value", "z"], r"look like longitude/latitude.*--crs EPSG:4326", None),
    ("ingest-unknown-crs", [*INGEST_GOOD, "--crs", "EPSG:999999"], r"unknown CRS 'EPSG:999999'", None),
    ("ingest-nonsense-crs", [*INGEST_GOOD, "--crs", "mercator-ish"], r"unknown CRS 'mercator-ish'", None),
    ("ingest-lonlat-labelled-projected", ["ingest", "{D}/lonlat.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                          "--value", "z", "--crs", "EPSG:28992"],
     r"look like longitude/latitude and lie outside the area of use of EPSG:28992, a projected CRS: they are not in "
     r"its units; pass --crs EPSG:4326 if they are degrees", None),
    ("ingest-absurd-value", ["ingest", "{D}/absurd_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z",
                             "--covariates", "c1"],
     r"column 'z' holds 1e\+308 in row 6 \(1 value\(s\) beyond ±1e\+150.*absurd value.*remove those rows", None),
    ("ingest-absurd-covariate", ["ingest", "{D}/absurd_c1.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value",
                                 "z", "--covariates", "c1"],
     r"column 'c1' holds -1e\+308 in row 9 .*absurd value", None),
    ("ingest-unknown-target-crs", ["ingest", "{D}/lonlat.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                   "--value", "z", "--crs", "EPSG:4326", "--target-crs", "EPSG:0"],
     r"unknown CRS 'EPSG:0'", None),
    ("ingest-geographic-target-crs", ["ingest", "{D}/lonlat.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                      "--value", "z", "--crs", "EPSG:4326", "--target-crs", "EPSG:4326"],
     r"--target-crs EPSG:4326 is geographic", None),
    ("ingest-site-of-1-row", ["ingest", "{D}/site_of_1.csv", *INGEST_GOOD[2:], "--partition", "column:g"],
     r"1 of 4 sites have fewer than 10 rows \('d' has 1\).*reveals its values.*merge the small groups of 'g'",
     None),
    ("ingest-site-of-5-rows", ["ingest", "{D}/site_of_5.csv", *INGEST_GOOD[2:], "--partition", "column:g"],
     r"1 of 4 sites have fewer than 10 rows \('d' has 5\)", None),
    ("ingest-workers-0", [*INGEST_GOOD, "--workers", "0"], r"--workers must be a positive integer", None),
    ("ingest-workers-neg", [*INGEST_GOOD, "--workers", "-3"], r"--workers must be a positive integer", None),
    ("ingest-workers-more-than-rows", [*INGEST_GOOD, "--workers", "100"], r"only 40 rows .* 100 workers", None),
    ("ingest-workers-not-int", [*INGEST_GOOD, "--workers", "three"], r"--workers: invalid int value", None),
    ("ingest-sizes-too-many-rows", [*INGEST_GOOD, "--sizes", "30,30"], r"sizes sum to 60 but there are 40 rows", None),
    ("ingest-sizes-zero", [*INGEST_GOOD, "--sizes", "40,0"], r"every worker needs at least one row", None),
    ("ingest-test-fraction-1", [*INGEST_GOOD, "--test-fraction", "1"], r"--test-fraction must be in \[0, 1\)", None),
    ("ingest-test-fraction-neg", [*INGEST_GOOD, "--test-fraction", "-0.1"],
     r"--test-fraction must be in \[0, 1\)", None),
    ("ingest-test-fraction-big", [*INGEST_GOOD, "--test-fraction", "1.5"],
     r"--test-fraction must be in \[0, 1\)", None),
    ("ingest-test-fraction-nan", [*INGEST_GOOD, "--test-fraction", "nan"],
     r"--test-fraction must be in \[0, 1\)", None),
    ("ingest-unknown-partition", [*INGEST_GOOD, "--partition", "hexagons"], r"unknown partition 'hexagons'", None),
    ("ingest-partition-column-missing", [*INGEST_GOOD, "--partition", "column:site"], r"\['site'\] not in the table",
     None),
    ("ingest-partition-column-with-workers", [*INGEST_GOOD, "--partition", "column:g", "--workers", "5"],
     r"column 'g' has 3 groups but --workers is 5", None),
    ("ingest-fewer-points-than-parameters", ["ingest", "{D}/few.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                             "--value", "z", "--covariates", "c1,c2", "--workers", "1"],
     r"only 4 distinct location.*fewer than the 7 needed", None),
    ("ingest-zero-variance-z", ["ingest", "{D}/const_z.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"'z' has the same value \(3\.25\) in all 40 rows", None),
    ("ingest-duplicate-coordinates", ["ingest", "{D}/dups.csv", "{T}/out.zarr", "--x", "x", "--y", "y",
                                      "--value", "z"], r"share their coordinates.*--duplicates merge", None),
    ("ingest-no-design-columns", [*INGEST_GOOD, "--no-intercept"], r"design matrix would have no columns", None),
    ("ingest-out-exists", ["ingest", "{D}/good.csv", "{T}/out", "--x", "x", "--y", "y", "--value", "z"],
     r"already exists.*--overwrite", "out_file"),
    ("ingest-out-under-file", ["ingest", "{D}/good.csv", "{FILE}/out.zarr", "--x", "x", "--y", "y", "--value", "z"],
     r"not a directory|is a file|file\.txt", None),
    ("ingest-unknown-duplicates", [*INGEST_GOOD, "--duplicates", "average"], r"--duplicates: invalid choice", None),
    # fit: the store
    ("fit-missing-store", ["fit", "{T}/nope.zarr", "--out", "{T}/out", *FIT],
     r"nope\.zarr is not a Zarr v3 store", None),
    ("fit-store-small-site", ["fit", "{SMALLSITE}", "--out", "{T}/out", *FIT],
     r"1 of 3 sites have fewer than 10 rows \(w2 has 5\): a site that small reveals its values", None),
    ("fit-store-is-file", ["fit", "{FILE}", "--out", "{T}/out", *FIT], r"file\.txt is not a Zarr v3 store", None),
    ("fit-store-is-empty-dir", ["fit", "{EMPTYDIR}", "--out", "{T}/out", *FIT], r"emptydir.*not a Zarr", None),
    ("fit-store-is-csv", ["fit", "{D}/good.csv", "--out", "{T}/out", *FIT], r"good\.csv is not a Zarr v3 store", None),
    ("fit-store-deleted-chunk", ["fit", "{DELETED}", "--out", "{T}/out", *FIT],
     r"partition workers/1.*(damaged|deleted|checksum)", None),
    ("fit-store-corrupted-chunk", ["fit", "{CORRUPTED}", "--out", "{T}/out", *FIT],
     r"partition workers/1 .*damaged", None),
    ("fit-store-truncated-chunk", ["fit", "{TRUNCATED}", "--out", "{T}/out", *FIT],
     r"partition workers/1 .*damaged", None),
    ("fit-store-missing-group", ["fit", "{NO_GROUP}", "--out", "{T}/out", *FIT],
     r"workers/ holds groups \['0', '1'\], expected exactly 0\.\.2", None),
    ("fit-store-no-root-metadata", ["fit", "{NO_ROOT}", "--out", "{T}/out", *FIT], r"not a Zarr v3 store", None),
    ("fit-store-bad-root-json", ["fit", "{BAD_ROOT_JSON}", "--out", "{T}/out", *FIT],
     r"bad_root_json\.zarr/zarr\.json is not valid JSON \(.*\): the store's metadata is truncated or damaged; "
     r"re-ingest", None),
    ("fit-store-bad-group-json", ["fit", "{BAD_GROUP_JSON}", "--out", "{T}/out", *FIT],
     r"bad_group_json\.zarr/workers/1/zarr\.json is not valid JSON \(.*\): the store's metadata is truncated or "
     r"damaged; re-ingest", None),
    ("fit-store-bad-array-json", ["fit", "{BAD_ARRAY_JSON}", "--out", "{T}/out", *FIT],
     r"bad_array_json\.zarr/workers/1/z/zarr\.json is not valid JSON \(.*\): the store's metadata is truncated or "
     r"damaged; re-ingest", None),
    ("fit-store-degrees-labelled-projected", ["fit", "{DEGREES}", "--out", "{T}/out", *FIT],
     r"the store's coordinates \(bounding box .*\) look like longitude/latitude and lie outside the area of use of "
     r"EPSG:28992.*ingest the source table again with --crs EPSG:4326", None),
    ("fit-store-corrupted-chunk-dask", ["fit", "{CORRUPTED}", "--out", "{T}/out", "--runtime", "dask",
                                        "--dask-workers", "1", "--knots", "9", "--max-iter", "3", "--quiet"],
     r"federated worker 1 failed in sub-step 'load' .*partition workers/1 .*damaged", None),
    ("fit-store-on-a-line", ["fit", "{LINE}", "--out", "{T}/out", *FIT], r"strip .*collinear.*\(--domain FILE\)", None),
    ("fit-no-store", ["fit", "--out", "{T}/out", *FIT], r"needs STORE\.zarr", None),
    ("fit-no-out", ["fit", "{S}", *FIT], r"--out DIR", None),
    # fit: the options
    ("fit-knots-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "0"],
     r"knots must be a positive integer m .*got 0", None),
    ("fit-knots-1", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "1"], r"knots=1: .* at least 2 knots", None),
    ("fit-knots-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "-3"],
     r"knots must be a positive integer m .*got -3", None),
    ("fit-knots-huge", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "1000000000"],
     r"knots=1000000000 would need about .* GB.*use fewer knots", None),
    ("fit-knots-float", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "2.5"], r"--knots: invalid int value '2\.5': give a whole number of knots or a file", None),
    ("fit-knots-file-missing", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "{D}/nope.csv"],
     r"points file .*nope\.csv does not exist", None),
    ("fit-knots-file-outside", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "{D}/knots_outside.csv"],
     r"1 of 4 knots lie outside the domain: #3 \(1\.5, 0\.5\).*--domain FILE", None),
    ("fit-knots-file-duplicate", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "{D}/knots_dup.csv"],
     r"1 knot\(s\) repeat another knot's location .*drop the duplicates", None),
    ("fit-knots-file-no-columns", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots", "{D}/knots_ab.csv"],
     r"knots_ab\.csv has no coordinate columns .*--x COL --y COL", None),
    ("fit-knots-file-crs-on-planar-store", ["fit", "{S}", "--out", "{T}/out", *FIT, "--knots",
                                            "{D}/knots_dup.csv", "--crs", "EPSG:4326"],
     r"knots_dup\.csv is in EPSG:4326 but the store has planar units .*drop --crs", None),
    ("fit-knots-columns-without-file", ["fit", "{S}", "--out", "{T}/out", *FIT, "--x", "lon", "--y", "lat"],
     r"--x, --y describe the points of --knots FILE", None),
    ("fit-nu-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--nu", "0"], r"\bnu\b.*> 0", None),
    ("fit-nu-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--nu", "-1"], r"\bnu\b.*> 0", None),
    ("fit-nu-huge", ["fit", "{S}", "--out", "{T}/out", *FIT, "--nu", "1e6"],
     r"nu must be at most 40, got 1000000\.0", None),
    ("fit-nu-nan", ["fit", "{S}", "--out", "{T}/out", *FIT, "--nu", "nan"], r"\bnu\b.*> 0", None),
    ("fit-nu-inf", ["fit", "{S}", "--out", "{T}/out", *FIT, "--nu", "inf"],
     r"nu \(Matérn smoothness\) must be a number > 0 or 'estimate' \(fitted within 0.2–4.0\), got inf", None),
    ("fit-agg-threshold-0-sync", ["fit", "{S}", "--out", "{T}/out", *FIT, "--mode", "sync", "--agg-threshold", "0"],
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 0", None),
    ("fit-agg-threshold-J+1-sync", ["fit", "{S}", "--out", "{T}/out", *FIT, "--mode", "sync",
                                    "--agg-threshold", "4"],
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 4", None),
    ("fit-agg-threshold-0-async", ["fit", "{S}", "--out", "{T}/out", *FIT, "--agg-threshold", "0"],
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 0", None),
    ("fit-agg-threshold-J+1-async", ["fit", "{S}", "--out", "{T}/out", *FIT, "--agg-threshold", "4"],
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 4", None),
    ("fit-unknown-preset", ["fit", "{S}", "--out", "{T}/out", *FIT, "--preset", "fast"],
     r"--preset: invalid choice: 'fast'", None),
    ("fit-unknown-method", ["fit", "{S}", "--out", "{T}/out", *FIT, "--method", "kriging"],
     r"--method: invalid choice: 'kriging'", None),
    ("fit-unknown-mode", ["fit", "{S}", "--out", "{T}/out", *FIT, "--mode", "semi"], r"--mode: invalid choice", None),
    ("fit-unknown-residual", ["fit", "{S}", "--out", "{T}/out", *FIT, "--residual", "diag"],
     r"--residual: invalid choice", None),
    ("fit-unknown-profile", ["fit", "{S}", "--out", "{T}/out", *FIT, "--profile", "slow"],
     r"--profile: unknown heterogeneity profile 'slow'; choose one of", None),
    ("fit-profile-bad-min-cores", ["fit", "{S}", "--out", "{T}/out", *FIT, "--profile", "graded:0"],
     r"--profile: profile 'graded:0': the minimum cores must be a number in \(0, 62\], e.g. graded:12", None),
    ("fit-unknown-runtime", ["fit", "{S}", "--out", "{T}/out", "--runtime", "ray"], r"--runtime: invalid choice",
     None),
    ("fit-slowdown-wrong-count", ["fit", "{S}", "--out", "{T}/out", *FIT, "--slowdown", "1,2"],
     r"got 2 slowdown factors for 3 workers", None),
    ("fit-slowdown-below-1", ["fit", "{S}", "--out", "{T}/out", *FIT, "--slowdown", "1,0.5,1"],
     r"slowdown factors must be finite numbers ≥ 1 .*0\.5", None),
    ("fit-slowdown-nan", ["fit", "{S}", "--out", "{T}/out", *FIT, "--slowdown", "1,nan,1"],
     r"slowdown factors must be finite numbers ≥ 1 .*nan", None),
    ("fit-slowdown-text", ["fit", "{S}", "--out", "{T}/out", *FIT, "--slowdown", "1,fast,1"],
     r"--slowdown.*comma-separated numbers", None),
    ("fit-max-iter-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--max-iter", "0"],
     r"max_iter must be an integer ≥ 1, got 0", None),
    ("fit-max-iter-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--max-iter", "-5"],
     r"max_iter must be an integer ≥ 1, got -5", None),
    ("fit-tol-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--tol", "-1"], r"tol must be > 0, got -1", None),
    ("fit-tol-nan", ["fit", "{S}", "--out", "{T}/out", *FIT, "--tol", "nan"], r"tol must be > 0, got nan", None),
    ("fit-time-budget-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--time-budget", "0"],
     r"time_budget must be a number of seconds > 0", None),
    ("fit-time-budget-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--time-budget", "-10"],
     r"time_budget must be a number of seconds > 0", None),
    ("fit-checkpoint-every-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--checkpoint-every", "0"],
     r"--checkpoint-every K: K must be a positive integer", None),
    ("fit-dask-workers-0", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--dask-workers", "0"],
     r"--dask-workers must be a positive integer, got 0", None),
    ("fit-dask-workers-1000", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--dask-workers", "1000"],
     r"--dask-workers 1000 is more than the store's \d+ sites: each Dask worker process serves at least one site; "
     r"give at most \d+", None),
    ("fit-plain-tcp-off-this-machine", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--scheduler",
                                        "tcp://0.0.0.0:1"],
     r"the scheduler tcp://0.0.0.0:1 is plain TCP on 0.0.0.0, not this machine.*--insecure", None),
    ("fit-queue-wait-zero", ["fit", "{S}", "--out", "{T}/out", "--jobqueue", "slurm", "--queue-wait", "0"],
     r"--queue-wait must be a positive number of seconds, got 0", None),
    ("fit-scheduler-and-jobqueue", ["fit", "{S}", "--out", "{T}/out", "--scheduler", "tcp://127.0.0.1:1",
                                    "--jobqueue", "slurm"], r"give either --scheduler or --jobqueue", None),
    ("fit-simulated-with-scheduler", ["fit", "{S}", "--out", "{T}/out", *FIT, "--scheduler", "tcp://127.0.0.1:1"],
     r"--runtime simulated runs in this process; .* leave --runtime out", None),
    ("fit-fgpr-option-without-fgpr", ["fit", "{S}", "--out", "{T}/out", *FIT, "--local-steps", "3"],
     r"--local-steps apply to --method fgpr only", None),
    ("fit-participation-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--method", "fgpr", "--participation", "0"],
     r"participation .* must be an integer ≥ 1, got 0", None),
    ("fit-staleness-bound-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--staleness-bound", "-1"],
     r"staleness_bound .* must be an integer ≥ 0", None),
    ("fit-privacy-noise-neg", ["fit", "{S}", "--out", "{T}/out", *FIT, "--privacy-noise", "-1",
                               "--privacy-clip", "1"], r"noise_multiplier must be a finite number > 0, got -1", None),
    ("fit-privacy-noise-too-large", ["fit", "{S}", "--out", "{T}/out", *FIT, "--privacy-noise", "1e9",
                                     "--privacy-clip", "1"],
     r"privacy noise multiplier 1e\+09 is too large for a fit: with 3 sites .*use a multiplier of at most 86\.6", None),
    ("fit-privacy-noise-without-clip", ["fit", "{S}", "--out", "{T}/out", *FIT, "--privacy-noise", "1"],
     r"needs both --privacy-noise Z and --privacy-clip C", None),
    ("fit-privacy-clip-0", ["fit", "{S}", "--out", "{T}/out", *FIT, "--privacy-noise", "1", "--privacy-clip", "0"],
     r"clip must be a finite number > 0", None),
    ("fit-privacy-delta-1", ["fit", "{S}", "--out", "{T}/out", *FIT, "--privacy-noise", "1", "--privacy-clip", "1",
                             "--privacy-delta", "1"], r"delta must be a float in \(0, 1\), got 1\.0", None),
    ("fit-delays-no-mean", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "exponential"],
     r"cannot parse the delay model 'exponential'", None),
    ("fit-delays-unknown-kind", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "gamma:1"],
     r"cannot parse the delay model 'gamma:1'", None),
    ("fit-delays-text", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "exponential:soon"],
     r"exponential mean must be a number .* got 'soon'", None),
    ("fit-delays-negative", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "exponential:-1"],
     r"mean_s must be finite numbers ≥ 0, got -1", None),
    ("fit-delays-poisson-no-unit", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "poisson:2"],
     r"cannot parse the delay model 'poisson:2'", None),
    ("fit-delays-wrong-count", ["fit", "{S}", "--out", "{T}/out", *FIT, "--delays", "exponential:1,2"],
     r"got 2 values of mean_s for 3 workers", None),
    ("fit-activations-no-rate", ["fit", "{S}", "--out", "{T}/out", *FIT, "--activations", "poisson"],
     r"cannot parse the activation model 'poisson'", None),
    ("fit-activations-unknown-kind", ["fit", "{S}", "--out", "{T}/out", *FIT, "--activations", "exponential:1"],
     r"cannot parse the activation model", None),
    ("fit-activations-text", ["fit", "{S}", "--out", "{T}/out", *FIT, "--activations", "poisson:often"],
     r"activation rate must be a number .* got 'often'", None),
    ("fit-activations-zero", ["fit", "{S}", "--out", "{T}/out", *FIT, "--activations", "poisson:0"],
     r"activation rate must be finite numbers > 0, got 0", None),
    ("fit-domain-line", ["fit", "{S}", "--out", "{T}/out", *FIT, "--domain", "{D}/line.geojson"],
     r"line\.geojson holds no polygon with positive area", None),
    ("fit-domain-points", ["fit", "{S}", "--out", "{T}/out", *FIT, "--domain", "{D}/points.geojson"],
     r"points\.geojson holds no polygon with positive area", None),
    ("fit-domain-missing", ["fit", "{S}", "--out", "{T}/out", *FIT, "--domain", "{D}/nope.gpkg"],
     r"cannot read domain file .*nope\.gpkg", None),
    ("fit-domain-garbage", ["fit", "{S}", "--out", "{T}/out", *FIT, "--domain", "{D}/garbage.geojson"],
     r"cannot read domain file .*garbage\.geojson", None),
    ("fit-domain-text-file", ["fit", "{S}", "--out", "{T}/out", *FIT, "--domain", "{D}/not_a_domain.txt"],
     r"cannot read domain file .*not_a_domain\.txt", None),
    # fit: the outputs
    ("fit-out-is-file", ["fit", "{S}", "--out", "{T}/out", *FIT], r"out: it exists and is a file, not a directory",
     "out_file"),
    ("fit-out-under-file", ["fit", "{S}", "--out", "{FILE}/out", *FIT], r"file\.txt is a file, not a directory", None),
    ("fit-out-in-read-only-dir", ["fit", "{S}", "--out", "{T}/ro/out", *FIT], r"ro/out|permission|read-only",
     "read_only"),
    ("fit-tls-malformed-pem", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--tls-dir", "{TLS}"],
     r"ca\.pem is not a valid PEM file", None),
    ("fit-tls-missing-files", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--tls-dir", "{TLSPART}"],
     r"cert\.pem not found", None),
    ("fit-tls-with-simulated", ["fit", "{S}", "--out", "{T}/out", *FIT, "--tls"],
     r"tls applies to the Dask connections; --runtime simulated has none",
     None),
    ("fit-tls-scheduler-without-tls-dir", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--scheduler", "{TLSADDR}"],
     r"scheduler tls://127\.0\.0\.1:\d+ uses TLS: pass --tls-dir DIR with the certificates .*docs/hpc\.md", None),
    ("fit-tcp-address-at-tls-scheduler", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--scheduler", "{TCPADDR}"],
     r"scheduler at tcp://127\.0\.0\.1:(\d+) wants TLS: give --scheduler tls://127\.0\.0\.1:\1 and --tls-dir DIR",
     None),
    ("fit-tls-scheduler-other-certificates", ["fit", "{S}", "--out", "{T}/out", "--quiet", "--scheduler",
                                              "{TLSADDR}", "--tls"],
     r"did not accept this client's certificate .*pass --tls-dir DIR", None),
    ("fit-out-exists", ["fit", "{S}", "--out", "{T}/out", *FIT],
     r"out already exists; choose another path or pass --overwrite to replace it$", "out_dir"),
    ("fit-out-holds-a-checkpoint", ["fit", "{S}", "--out", "{T}/ck", *FIT],
     r"ck already exists; .*--overwrite to replace it, or continue the fit it keeps with `spatialfed fit --resume "
     r".*/ck`", "ck_only"),
    # fit --resume
    ("resume-no-checkpoint", ["fit", "--resume", "{T}/ck", "--quiet"],
     r"no checkpoint at .*ck/checkpoint\.zip", "nock"),
    ("resume-dir-missing", ["fit", "--resume", "{T}/nope", "--quiet"], r"no checkpoint at .*nope", None),
    ("resume-empty-checkpoint", ["fit", "--resume", "{T}/ck", "--quiet"],
     r"checkpoint\.zip is not a spatialfed checkpoint", "empty_ck"),
    ("resume-not-a-checkpoint", ["fit", "--resume", "{T}/ck", "--quiet"],
     r"checkpoint\.zip is not a spatialfed checkpoint", "text_ck"),
    ("resume-other-store", ["fit", "{O}", "--resume", "{T}/ck", "--quiet"],
     r"checkpoint was made on store .*s\.zarr .*o\.zarr is a different store .*; pass .*s\.zarr as STORE\.zarr "
     r"\(or leave STORE\.zarr out", "ckdir"),
    ("resume-model-option", ["fit", "--resume", "{T}/ck", "--quiet", "--nu", "1.5"], r"cannot change \['nu'\]",
     "ckdir"),
    ("resume-store-missing", ["fit", "{T}/gone.zarr", "--resume", "{T}/ck", "--quiet"],
     r"gone\.zarr is not a Zarr v3 store", "ck_only"),
    # predict
    ("predict-fit-dir-missing", ["predict", "{T}/nofit", "--store", "{S}", "--out", "{T}/out.csv", *PRED],
     r"nofit/fit\.json not found", None),
    ("predict-fit-without-fit-json", ["predict", "{NOFIT}", "--store", "{S}", "--out", "{T}/out.csv", *PRED],
     r"fit_nojson/fit\.json not found", None),
    ("predict-fit-json-truncated", ["predict", "{BADFIT}", "--store", "{S}", "--out", "{T}/out.csv", *PRED],
     r"fit\.json is not valid JSON", None),
    ("predict-other-store", ["predict", "{F}", "--store", "{O}", "--out", "{T}/out.csv", *PRED],
     r"fit was made on store .*s\.zarr .*o\.zarr is a different store", None),
    ("predict-store-missing", ["predict", "{F}", "--store", "{T}/nope.zarr", "--out", "{T}/out.csv", *PRED],
     r"nope\.zarr is not a Zarr v3 store", None),
    ("predict-damaged-store", ["predict", "{F}", "--store", "{DELETED}", "--out", "{T}/out.csv", *PRED],
     r"partition workers/1 is damaged", None),
    ("predict-locations-without-covariates", ["predict", "{F}", "--store", "{S}", "--locations",
                                             "{D}/locs_nocov.csv", "--out", "{T}/out.csv", *PRED],
     r"lacks covariate column\(s\) \['x1', 'x2', 'x3', 'x4', 'x5'\]", None),
    ("predict-locations-some-covariates", ["predict", "{F}", "--store", "{S}", "--locations",
                                          "{D}/locs_somecov.csv", "--out", "{T}/out.csv", *PRED],
     r"lacks covariate column\(s\) \['x3', 'x4', 'x5'\]", None),
    ("predict-locations-nan", ["predict", "{F}", "--store", "{S}", "--locations", "{D}/locs_nan.csv",
                               "--out", "{T}/out.csv", *PRED],
     r"1 of 8 points in locs_nan\.csv are NaN or infinite", None),
    ("predict-locations-text", ["predict", "{F}", "--store", "{S}", "--locations", "{D}/locs_text.csv",
                                "--out", "{T}/out.csv", *PRED], r"non-numeric covariates", None),
    ("predict-locations-empty", ["predict", "{F}", "--store", "{S}", "--locations", "{D}/locs_empty.csv",
                                 "--out", "{T}/out.csv", *PRED], r"no points in locs_empty\.csv", None),
    ("predict-locations-missing", ["predict", "{F}", "--store", "{S}", "--locations", "{D}/nope.csv",
                                   "--out", "{T}/out.csv", *PRED], r"nope\.csv does not exist", None),
    ("predict-out-exists", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out.csv", *PRED],
     r"out\.csv already exists; choose another path or pass --overwrite to replace it", "out_csv"),
    ("predict-metrics-exists", ["predict", "{F}", "--store", "{S}", "--out", "{T}/other.csv", *PRED],
     r"metrics\.json already exists; predict into another directory or pass --overwrite to replace it",
     "metrics_json"),
    ("predict-locations-named-columns-missing", ["predict", "{F}", "--store", "{S}", "--locations",
                                                 "{D}/locs_nocov.csv", "--x", "east", "--y", "north",
                                                 "--out", "{T}/out.csv", *PRED],
     r"locs_nocov\.csv has no columns 'east' and 'north' among \['x', 'y'\]; name them with --x COL --y COL", None),
    ("predict-locations-one-column-named", ["predict", "{F}", "--store", "{S}", "--locations",
                                            "{D}/locs_nocov.csv", "--x", "x", "--out", "{T}/out.csv", *PRED],
     r"name both coordinate columns of .*locs_nocov\.csv \(--x COL --y COL\)", None),
    ("predict-out-no-extension", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out", *PRED],
     r"\(no extension\) is not one of \.csv, \.gpkg, \.parquet", "out_file"),
    ("predict-out-under-file", ["predict", "{F}", "--store", "{S}", "--out", "{FILE}/out.csv", *PRED],
     r"file\.txt is a file, not a directory", None),
    ("predict-unknown-format", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out.xlsx", *PRED],
     r"\.xlsx is not one of \.csv, \.gpkg, \.parquet", None),
    ("predict-personal-worker-out-of-range", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out.csv", *PRED,
                                             "--predictor", "personal", "--worker", "7"],
     r"worker index 0\.\.2 \(--worker J\), got 7",
     None),
    ("predict-personal-without-worker", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out.csv", *PRED,
                                        "--predictor", "personal"],
     r"worker index 0\.\.2 \(--worker J\), got None", None),
    ("predict-unknown-predictor", ["predict", "{F}", "--store", "{S}", "--out", "{T}/out.csv", *PRED,
                                   "--predictor", "magic"], r"--predictor: invalid choice", None),
    ("predict-no-store", ["predict", "{F}", "--out", "{T}/out.csv", *PRED], r"required: --store", None),
    # map
    ("map-without-covariates", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *PRED, "--resolution", "0.1"],
     r"uses covariate\(s\) \['x1', 'x2', 'x3', 'x4', 'x5'\]; give their values .* --covariates", None),
    ("map-covariates-lacking-columns", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *PRED,
                                        "--resolution", "0.1", "--covariates", "{D}/locs_nocov.csv"],
     r"locs_nocov\.csv lacks covariate column\(s\) \['x1'", None),
    ("map-resolution-0", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "0"],
     r"resolution must be a finite number > 0 .*got 0\.0", None),
    ("map-resolution-neg", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "-0.1"],
     r"resolution must be a finite number > 0 .*got -0\.1", None),
    ("map-resolution-nan", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "nan"],
     r"resolution must be a finite number > 0 .*got nan", None),
    ("map-resolution-tiny", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "1e-9"],
     r"resolution 1e-09 gives .* cells .*coarser resolution", None),
    ("map-domain-line", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "0.1",
                         "--domain", "{D}/line.geojson"], r"line\.geojson holds no polygon with positive area", None),
    ("map-other-store", ["map", "{F}", "--store", "{O}", "--out", "{T}/out", *MAPCOV, "--resolution", "0.1"],
     r"fit was made on store .*s\.zarr .*o\.zarr is a different store", None),
    ("map-fit-without-fit-json", ["map", "{NOFIT}", "--store", "{S}", "--out", "{T}/out", *PRED],
     r"fit_nojson/fit\.json not found",
     None),
    ("map-out-is-file", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "0.1"],
     r"out exists and is not a directory", "out_file"),
    ("map-out-exists", ["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "0.1"],
     r"out already exists; choose another path or pass --overwrite to replace it", "out_dir"),
    ("map-out-under-file", ["map", "{F}", "--store", "{S}", "--out", "{FILE}/out", *MAPCOV, "--resolution", "0.1"],
     r"file\.txt/out: .*file\.txt is a file, not a directory", None),
    # other commands
    ("cluster-script-unknown-system", ["cluster-script", "lsf"], r"unknown batch system 'lsf'", None),
    ("cluster-script-bad-walltime", ["cluster-script", "slurm", "--walltime", "2h"],
     r"walltime must be \[D-\]HH:MM:SS, MM:SS or minutes, got '2h'", None),
    ("demo-out-exists", ["demo", "--out", "{T}/out"],
     r"out already exists; choose another path or pass --overwrite to replace it", "out_dir"),
    ("pilot-clip-out-exists", ["pilot-clip", "{S}", "--out", "{T}/out"],
     r"out already exists; choose another path or pass --overwrite to replace it", "out_file"),
    ("pilot-clip-missing-store", ["pilot-clip", "{T}/nope.zarr", "--out", "{T}/clip.json"],
     r"nope\.zarr is not a Zarr v3 store", None),
]


def _case_dir(tmp_path: Path) -> Path:
    T = tmp_path / "case"
    T.mkdir()
    return T


def _params(cases):
    return [pytest.param(*c[1:], id=c[0]) for c in cases]


@pytest.mark.parametrize("argv, pattern, setup", _params(CLI_CASES))
def test_cli_refuses_bad_input(world, tmp_path, capsys, argv, pattern, setup):
    T = _case_dir(tmp_path)
    _prepare(setup, world, T)
    before = _listing(T)
    snapshot = {p: (T / p).read_bytes() for p in before if (T / p).is_file()}
    code, err = run_cli(_fill(argv, world, T), capsys)
    check_message(code, err, pattern)
    assert _listing(T) == before, f"left behind: {sorted(_listing(T) - before)}"
    assert all((T / p).read_bytes() == data for p, data in snapshot.items()), "an existing file was changed"


# --- the same through `python -m spatialfed` (stderr as a user sees it) -----------------------------------------------

SLOW = pytest.mark.slow  # a new interpreter importing the library: 5-15 s each on a loaded 2-core machine
SUBPROCESS_CASES = [pytest.param("unknown-subcommand"), pytest.param("ingest-huge-x"),
                    pytest.param("fit-store-deleted-chunk", marks=SLOW), pytest.param("fit-knots-huge", marks=SLOW),
                    pytest.param("predict-fit-without-fit-json", marks=SLOW),
                    pytest.param("fit-out-under-file", marks=SLOW),
                    pytest.param("fit-store-corrupted-chunk-dask", marks=SLOW)]  # the workers' stderr is seen too


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_python_dash_m_prints_no_traceback(world, tmp_path, case):
    _, argv, pattern, setup = next(c for c in CLI_CASES if c[0] == case)
    T = _case_dir(tmp_path)
    _prepare(setup, world, T)
    before = _listing(T)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "spatialfed", *_fill(argv, world, T)], capture_output=True,
                          text=True, timeout=120, env=env)
    check_message(done.returncode, done.stderr, pattern)
    assert done.stdout == "" or "Traceback" not in done.stdout
    assert _listing(T) == before


# --- a full disk ------------------------------------------------------------------------------------------------------
# RLIMIT_FSIZE makes every write beyond a few kB fail with EFBIG ("File too large"), as a full disk fails with
# ENOSPC, part-way through the output: the staged output must vanish and the error be one line.

FULL_DISK = [
    pytest.param(["simulate", "{T}/out.zarr", "--quiet", *J3], 3000, id="simulate"),
    pytest.param(["ingest", "{D}/good.csv", "{T}/out.zarr", "--x", "x", "--y", "y", "--value", "z"], 300, id="ingest"),
    pytest.param(["fit", "{S}", "--out", "{T}/out", *FIT], 3000, id="fit"),
    pytest.param(["map", "{F}", "--store", "{S}", "--out", "{T}/out", *MAPCOV, "--resolution", "0.1"], 3000, id="map"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, limit", FULL_DISK)
def test_a_full_disk_is_one_line_and_leaves_nothing(world, tmp_path, argv, limit):
    import resource

    T = _case_dir(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "spatialfed", *_fill(argv, world, T)], capture_output=True,
                          text=True, timeout=300, env=env,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    check_message(done.returncode, done.stderr, r"File too large|could not write")
    assert _listing(T) == set(), f"left behind: {sorted(_listing(T))}"


# --- the Python API ---------------------------------------------------------------------------------------------------

def _gp(**kw):
    from spatialfed.api import FederatedGP

    return FederatedGP(**{"cluster": "simulated", "knots": 9, "max_iter": 3, "progress": False, **kw})


def _fit(store_key, **kw):
    return lambda w, T: _gp(**kw).fit(w[store_key] if store_key in w else store_key.format(T=T, **w))


def _write(parts_fn, names=("intercept", "c1"), crs=None):
    """write_store of the given parts into T/out.zarr (its checks must refuse them)."""
    def run(w, T):
        from spatialfed.data.store import write_store

        write_store(T / "out.zarr", parts_fn(), partition="random", crs=crs, covariate_names=list(names))
    return run


def _fit_raw(parts_fn, **attrs):
    """FederatedGP.fit on a store written by zarr directly (no write-time checks) in T/raw.zarr."""
    def run(w, T):
        path = _store(T / "raw.zarr", parts_fn(), **attrs)
        _gp().fit(path).save(T / "out")
    return run


_RNG = np.random.default_rng(11)
_LOCS = _RNG.uniform(size=(60, 2))


def _poke(arr_index, row, col, value):
    def parts():
        ps = [tuple(a.copy() for a in p) for p in _parts(_LOCS)]
        a = ps[1][arr_index]
        if a.ndim == 1:
            a[row] = value
        else:
            a[row, col] = value
        return ps
    return parts


def _dependent():
    """Two workers' data whose covariate column is the intercept again (ΣXᵀX singular)."""
    return [(locs, z, np.ones_like(X)) for locs, z, X in _parts(_LOCS)]


def _predict(fit_key, store_key, **kw):
    def run(w, T):
        from spatialfed.outputs.prediction import predict, write_prediction

        frame, scores = predict(w[fit_key], w[store_key], runtime="simulated", **kw)
        write_prediction(frame, T / "out.csv", scores)
    return run


def _map(fit_key, store_key, covariates="cov_grid.csv", **kw):
    def run(w, T):
        from spatialfed.outputs.maps import make_map

        make_map(w[fit_key], w[store_key], T / "out", runtime="simulated", covariates=Path(w["D"]) / covariates, **kw)
    return run


def _save_under_file(w, T):
    _gp().fit(w["S"]).save(Path(w["FILE"]) / "out")


def _save_over_file(w, T):
    (T / "out").write_text("keep me\n")
    _gp().fit(w["S"]).save(T / "out")


def _prior(T: Path) -> Path:
    """An earlier output in T/prior (a directory holding notes.txt) that a call must refuse to replace."""
    (T / "prior").mkdir()
    (T / "prior" / "notes.txt").write_text("keep me\n")
    return T / "prior"


def _save_over_output(w, T):
    _gp().fit(w["S"]).save(_prior(T))


def _map_over_output(w, T):
    from spatialfed.outputs.maps import make_map

    make_map(w["F"], w["S"], _prior(T), runtime="simulated", covariates=Path(w["D"]) / "cov_grid.csv",
             resolution=0.1)


def _predict_over_output(w, T):
    from spatialfed.outputs.prediction import predict_to_file

    (_prior(T) / "pred.csv").write_text("x,y,mean\n0,0,1\n")
    predict_to_file(w["F"], w["S"], T / "prior" / "pred.csv", runtime="simulated", progress=False)


def _predict_over_metrics(w, T):
    from spatialfed.outputs.prediction import predict_to_file

    (_prior(T) / "metrics.json").write_text('{"rmse": 1.0}\n')
    predict_to_file(w["F"], w["S"], T / "prior" / "other.csv", runtime="simulated", progress=False)


def _simulate_over_output(w, T):
    from spatialfed.data.simulate import simulate_store

    simulate_store(_prior(T), 3, 30)


def _fit_scheduler(key):
    return lambda w, T: _gp(cluster=w[key]).fit(w["S"])


def _resume_other_store(w, T):
    from spatialfed.api import FederatedGP

    shutil.copytree(w["CK"], T / "ck")
    FederatedGP.resume(T / "ck" / "checkpoint.zip", store=w["O"], progress=False)


def _resume_missing(w, T):
    from spatialfed.api import FederatedGP

    FederatedGP.resume(T / "nope" / "checkpoint.zip")


def _load(key):
    def run(w, T):
        from spatialfed.api import FederatedGP

        FederatedGP.load(w[key] if key in w else key.format(T=T))
    return run


def _ingest_frame(frame_fn, **kw):
    def run(w, T):
        from spatialfed.data.ingest import ingest_frame

        ingest_frame(frame_fn(), T / "out.zarr", **{"value": "z", "x": "x", "y": "y", "n_workers": 2, **kw})
    return run


def _frame(**columns):
    import pandas as pd

    rng = np.random.default_rng(4)
    base = {"x": rng.uniform(0, 100, 30), "y": rng.uniform(0, 100, 30), "z": rng.normal(size=30)}
    base.update(columns)
    return lambda: pd.DataFrame(base)


def _fit_frame(frame_fn, **kw):
    """FederatedGP(**kw).fit(frame, "z") on an in-memory table (written to a temporary store, never to T)."""
    def run(w, T):
        _gp(**kw).fit(frame_fn(), "z")
    return run


_Z = np.random.default_rng(4).normal(size=30)


API_CASES = [
    ("api-covariates-id-column", _fit_frame(_frame(record=np.arange(30), elev=np.linspace(0, 1, 30) ** 2)),
     r"X's column 'record' is named like an identifier.*pass covariates=\['elev'\]"),
    ("api-covariates-row-sequence", _fit_frame(_frame(n=np.arange(1, 31).astype(float))),
     r"X's column 'n' is the row sequence 1\.\.30 .*covariates=\[\]"),
    ("api-covariates-distinct-integers", _fit_frame(_frame(code=np.random.default_rng(1).permutation(30) * 7)),
     r"X's column 'code' holds 30 distinct integers, one per row"),
    ("api-covariates-copy-of-y", _fit_frame(_frame(z=_Z, joker=2 * _Z + 1e-6 * np.arange(30))),
     r"X's column 'joker' is a near-copy of y \(correlation 1\.0000\).*pass covariates=\[\]"),
    ("api-covariates-missing", _fit_frame(_frame(elev=np.ones(30)), covariates=["elev", "slope"]),
     r"covariates=\['elev', 'slope'\]: column\(s\) \['slope'\] are not among X's columns \['elev'\]"),
    ("api-covariates-string", _fit_frame(_frame(elev=np.ones(30)), covariates="elev"),
     r"covariates must be a list of column names, e.g\. covariates=\['elev'\]"),
    ("api-covariates-with-store", _fit("S", covariates=[]), r"X is a store path .* drop covariates="),
    ("api-unknown-mode", _fit("S", mode="semi"), r"mode must be one of"),
    ("api-unknown-method", _fit("S", method="kriging"), r"method must be one of"),
    ("api-unknown-residual", _fit("S", residual="diag"), r"residual must be one of"),
    ("api-unknown-profile", _fit("S", emulation=Emulation(profile="slow")), r"profile must be one of"),
    ("api-profile-bad-min-cores", _fit("S", emulation=Emulation(profile="graded:70")),
     r"the minimum cores must be a number in"),
    ("api-unknown-preset", _fit("S", strategies="fast"), r"preset must be one of .* got 'fast'"),
    ("api-unknown-runtime", _fit("S", cluster="ray"), r"cluster must be one of \('dask', 'simulated'\), a scheduler address .* got 'ray'"),
    ("api-knots-0", _fit("S", knots=0), r"knots must be a positive integer m .*got 0"),
    ("api-knots-1", _fit("S", knots=1), r"knots=1: .* at least 2 knots"),
    ("api-knots-neg", _fit("S", knots=-3), r"knots must be a positive integer m .*got -3"),
    ("api-knots-huge", _fit("S", knots=10**9), r"knots=1000000000 would need about .* GB"),
    ("api-knots-bad-array", _fit("S", knots=np.zeros((4, 3))),
     r"knots must be an \(m, 2\) array .* got shape \(4, 3\)"),
    ("api-knots-nan-array", _fit("S", knots=np.array([[0.1, 0.1], [np.nan, 0.5], [0.9, 0.9], [0.2, 0.8]])),
     r"knots hold NaN or infinite"),
    ("api-nu-0", _fit("S", nu=0), r"nu .*> 0"),
    ("api-nu-nan", _fit("S", nu=float("nan")), r"nu .*> 0"),
    ("api-nu-huge", _fit("S", nu=1e6), r"nu must be at most 40"),
    ("api-nu-string", _fit("S", nu="half"), r"nu \(Matérn smoothness\) must be a number > 0 or 'estimate' \(fitted within 0.2–4.0\), got 'half'"),
    ("api-agg-threshold-0", _fit("S", strategies={"agg_threshold": 0}),
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 0"),
    ("api-agg-threshold-J+1", _fit("S", strategies={"agg_threshold": 4}),
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 4"),
    ("api-agg-threshold-sync", _fit("S", strategies={"agg_threshold": 4}, mode="sync"),
     r"agg_threshold must be an integer in 1\.\.J = 1\.\.3 .*got 4"),
    ("api-slowdown-count", _fit("S", emulation=Emulation(slowdown=[1, 2])),
     r"got 2 slowdown factors for 3 workers"),
    ("api-slowdown-below-1", _fit("S", emulation=Emulation(slowdown=[1, 0.5, 1])),
     r"slowdown factors must be finite numbers ≥ 1"),
    ("api-max-iter-0", _fit("S", max_iter=0), r"max_iter must be an integer ≥ 1, got 0"),
    ("api-tol-neg", _fit("S", tol=-1), r"tol must be > 0, got -1"),
    ("api-time-budget-0", _fit("S", time_budget=0), r"time_budget must be a number of seconds > 0"),
    ("api-checkpoint-every-0", lambda w, T: _gp(checkpoint=Checkpoint(T / "c.zip", every=0)).fit(w["S"]),
     r"Checkpoint\(path, every=K\): K must be a positive integer"),
    ("api-unknown-strategy", _fit("S", strategies={"warp": True}), r"unknown fit setting\(s\) \['warp'\]"),
    ("api-bad-start", _fit("S", start={"delta": -1.0}), r"delta must be a finite number > 0, got -1"),
    ("api-missing-store", _fit("{T}/nope.zarr"), r"nope\.zarr is not a Zarr v3 store"),
    ("api-store-is-file", _fit("FILE"), r"file\.txt is not a Zarr v3 store"),
    ("api-deleted-chunk", _fit("DELETED"), r"partition workers/1.*(damaged|deleted|checksum)"),
    ("api-corrupted-chunk", _fit("CORRUPTED"), r"partition workers/1 .*damaged"),
    ("api-missing-group", _fit("NO_GROUP"), r"workers/ holds groups"),
    ("api-save-under-file", _save_under_file, r"file\.txt is a file, not a directory"),
    ("api-save-over-file", _save_over_file, r"out: it exists and is a file, not a directory"),
    ("api-resume-other-store", _resume_other_store,
     r"checkpoint was made on store .*s\.zarr .*o\.zarr is a different store .*; pass store='.*s\.zarr'"),
    ("api-resume-missing", _resume_missing, r"no checkpoint at .*nope"),
    ("api-load-missing", _load("{T}/nope"), r"cannot load .*nope: there is no fit directory; give a directory "
                                             r"written by FederatedGP\.save\(DIR\)"),
    ("api-load-without-fit-json", _load("NOFIT"), r"cannot load .*fit_nojson: .*fit\.json not found"),
    ("api-load-damaged-fit-json", _load("BADFIT"), r"cannot load .*fit_badjson: .*not valid JSON .*run the fit again"),
    ("api-write-degrees-labelled-projected",
     _write(lambda: _parts(np.column_stack([_RNG.uniform(5.6, 5.9, 30), _RNG.uniform(50.9, 51.1, 30)])),
            crs="EPSG:28992"),
     r"the coordinates look like longitude/latitude and lie outside the area of use of EPSG:28992.*project them to "
     r"metres first"),
    ("api-write-nan-z", _write(_poke(1, 3, 0, np.nan)), r"worker 1: z holds NaN"),
    ("api-write-inf-z", _write(_poke(1, 3, 0, np.inf)), r"worker 1: z holds NaN or infinite"),
    ("api-write-nan-x", _write(_poke(0, 3, 0, np.nan)), r"worker 1: locs holds NaN"),
    ("api-write-inf-y", _write(_poke(0, 3, 1, -np.inf)), r"worker 1: locs holds NaN or infinite"),
    ("api-write-nan-covariate", _write(_poke(2, 3, 1, np.nan)), r"worker 1: X holds NaN"),
    ("api-write-absurd-z", _write(_poke(1, 3, 0, 1e308)),
     r"worker 1: z holds 1e\+308 in row 3 \(beyond ±1e\+150, whose square overflows float64\): an absurd value"),
    ("api-write-absurd-covariate", _write(_poke(2, 4, 1, -1e300)), r"worker 1: X holds -1e\+300 in row 4, column 1"),
    ("api-write-wrong-p", _write(lambda: _parts(_LOCS), names=("intercept",)), r"X must have shape"),
    ("api-write-no-parts", _write(lambda: []), r"at least one worker"),
    ("api-write-huge-coords", _write(lambda: _parts(_LOCS * 1e300)), r"beyond ±1e\+12"),
    ("api-fit-nan-z-raw", _fit_raw(_poke(1, 3, 0, np.nan)), r"^z contains 1 non-finite value"),
    ("api-fit-inf-covariate-raw", _fit_raw(_poke(2, 3, 1, np.inf)), r"^X contains 1 non-finite value"),
    ("api-fit-nan-locs-raw", _fit_raw(_poke(0, 3, 0, np.nan)), r"^locs contains 1 non-finite value"),
    ("api-fit-huge-coords-raw", _fit_raw(lambda: _parts(_LOCS * 1e300)), r"beyond ±1e\+12"),
    ("api-fit-one-location-raw", _fit_raw(lambda: _parts(np.tile([[0.3, 0.4]], (60, 1)))),
     r"all observations lie at one location \(0\.3, 0\.4\)"),
    ("api-fit-collinear-raw", _fit_raw(lambda: _parts(np.column_stack([_LOCS[:, 0], np.full(60, 0.25)]))),
     r"strip .*collinear.*\(domain=\.\.\.\)"),
    ("api-fit-zero-variance-raw", _fit_raw(lambda: _parts(_LOCS, z=2.5)), r"covariates explain z exactly"),
    ("api-fit-tiny-sites-raw", _fit_raw(lambda: _parts(_LOCS[:4], J=2)), r"2 of 2 sites have fewer than 10 rows"),
    # owners who agreed to sites of 2 rows (the store's min_site_rows): then too few points for the parameters
    ("api-fit-few-points-raw", _fit_raw(lambda: _parts(_LOCS[:4], J=2), min_site_rows=1),
     r"5 parameters .* only N=4 observations"),
    ("api-fit-dependent-covariates-raw", _fit_raw(_dependent), r"covariates are linearly dependent"),
    ("api-ingest-nan-column", _ingest_frame(_frame(z=np.full(30, np.nan))), r"'z' has no values"),
    ("api-ingest-inf-column", _ingest_frame(_frame(x=np.full(30, np.inf))), r"'x' has no values at all"),
    ("api-ingest-constant-z", _ingest_frame(_frame(z=np.full(30, 1.0))),
     r"'z' has the same value \(1\) in all 30 rows"),
    ("api-ingest-object-column", _ingest_frame(_frame(z=np.array(["a"] * 30, dtype=object))),
     r"'z' has 30 non-numeric"),
    ("api-predict-other-store", _predict("F", "O"), r"fit was made on store .*s\.zarr .*o\.zarr is a different store"),
    ("api-predict-no-fit-json", _predict("NOFIT", "S"), r"fit_nojson/fit\.json not found"),
    ("api-map-resolution-0", _map("F", "S", resolution=0), r"resolution must be a finite number > 0 .*got 0"),
    ("api-map-other-store", _map("F", "O", resolution=0.1),
     r"fit was made on store .*s\.zarr .*o\.zarr is a different store"),
    ("api-map-covariates-lacking", _map("F", "S", resolution=0.1, covariates="locs_nocov.csv"),
     r"locs_nocov\.csv lacks covariate column"),
    # one overwrite rule (issue 28): an existing output is refused, naming overwrite=True
    ("api-save-over-output", _save_over_output, r"prior already exists; choose another path or pass overwrite=True"),
    ("api-map-over-output", _map_over_output, r"prior already exists; .* pass overwrite=True to replace it"),
    ("api-predict-over-output", _predict_over_output, r"pred\.csv already exists; .* pass overwrite=True"),
    ("api-simulate-over-output", _simulate_over_output, r"prior already exists; .* pass overwrite=True"),
    ("api-predict-over-metrics", _predict_over_metrics,
     r"prior/metrics\.json already exists; predict into another directory or pass overwrite=True"),
    # advice names the Python parameter (the CLI cases name the flag)
    ("api-ingest-duplicates", _ingest_frame(_frame(x=np.r_[500.0, 500.0, _RNG.uniform(0, 100, 28)],
                                                   y=np.r_[700.0, 700.0, _RNG.uniform(0, 100, 28)])),
     r"pass duplicates='merge' to average them or duplicates='keep' to keep them all"),
    ("api-ingest-lonlat-without-crs", _ingest_frame(_frame(x=_RNG.uniform(5, 6, 30), y=_RNG.uniform(50, 52, 30))),
     r"look like longitude/latitude .*pass crs='EPSG:4326' .*or crs='planar'"),
    ("api-tls-scheduler-without-tls", _fit_scheduler("TLSADDR"),
     r"scheduler tls://127\.0\.0\.1:\d+ uses TLS: pass Cluster\(tls='CERT_DIR'\) with the certificates"),
    ("api-tcp-address-at-tls-scheduler", _fit_scheduler("TCPADDR"),
     r"wants TLS: give cluster='tls://127\.0\.0\.1:\d+' and Cluster\(tls='CERT_DIR'\)"),
]


@pytest.mark.parametrize("call, pattern", _params(API_CASES))
def test_api_refuses_bad_input(world, tmp_path, call, pattern):
    T = _case_dir(tmp_path)
    with pytest.raises((SpatialFedError, ValueError, OSError)) as info:
        call(world, T)
    message = str(info.value)
    assert "\n" not in message.strip() and message.strip(), f"not one line: {message!r}"
    assert re.search(pattern, message, re.IGNORECASE), f"{pattern!r} not in {message!r}"
    assert not re.search(r"(^|[\s(])--[a-z]", message), f"Python advised a command-line flag: {message!r}"
    if (T / "prior").exists():  # an earlier output stays as it was
        assert _listing(T / "prior") >= {"notes.txt"} and (T / "prior" / "notes.txt").read_text() == "keep me\n"
    left = {p for p in _listing(T) if p.split("/")[0] not in ("raw.zarr", "ck", "prior")}  # the case's own inputs
    if (T / "out").is_file():  # a file that existed before the call stays as it was
        assert (T / "out").read_text() == "keep me\n"
        left.discard("out")
    assert not left, f"left behind: {sorted(left)}"
    assert not _tmp_leftovers(T)


def test_the_shared_inputs_are_untouched(world):
    """After every case (this test runs last): the stores, fits and files the cases read are as written, and no
    case staged anything beside them (e.g. a `*.tmp*` next to the store or fit directory it was pointed at)."""
    base = Path(world["base"])
    assert _listing(base) == world["listing"], sorted(_listing(base) ^ world["listing"])
    assert not _tmp_leftovers(base)


def test_case_count():
    """The count reported in docs/recovery.md ("Bad input") is the number of cases here."""
    total = len(CLI_CASES) + len(API_CASES)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "recovery.md").read_text()
    reported = re.search(r"(\d+) bad-input cases", doc)
    assert reported and int(reported.group(1)) == total, (total, reported and reported.group(0))
    assert len({c[0] for c in CLI_CASES + API_CASES}) == len(CLI_CASES) + len(API_CASES)
