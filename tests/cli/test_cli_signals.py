"""SIGTERM and SIGHUP, what a batch system sends at walltime and a closed terminal sends, stop a Dask fit as Ctrl-C
does (spatialfed.api.signals): the checkpoint of the point it stopped at, one line naming the resume command, exit
status 143 / 129, and no temporary store left with the raw rows.

Each case starts a real `python -m spatialfed fit` on the embedded LocalCluster in a process group of its own, waits
for the iteration's line on stderr (no fixed sleep) and signals the whole group with os.killpg, as a batch system
does (its workers receive the signal too). The resumed fit ends on the estimate of the same fit run uninterrupted:
the synchronous block-wise fit takes the same steps whatever the clock, so the two agree to rounding.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spatialfed.cli import main
from spatialfed.data.simulate import simulate_store

#: synchronous block-wise steps (about 14 iterations to converge), every task ~0.05 s later (--delays)
SETTINGS = ["--mode", "sync", "--preset", "tuned", "--knots", "9", "--max-iter", "30", "--tol", "1e-12"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    path = tmp_path_factory.mktemp("signals") / "s.zarr"
    simulate_store(path, 3, 40, test_size=0, seed=3)
    return path


@pytest.fixture(scope="module")
def uninterrupted(sim, tmp_path_factory):
    """fit.json of the same fit run uninterrupted to `max_iter` iterations (one run per value)."""
    runs = {}

    def fit(max_iter: int) -> dict:
        if max_iter not in runs:
            out = tmp_path_factory.mktemp("signals") / "fit"
            assert main(["fit", str(sim), "--out", str(out), "--runtime", "simulated", *SETTINGS, "--max-iter",
                         str(max_iter), "--quiet"]) == 0
            runs[max_iter] = json.loads((out / "fit.json").read_text())
        return runs[max_iter]

    return fit


def signal_at(cmd, iteration: int, signum: int, env: dict) -> tuple[int, str]:
    """Run `cmd` in a new process group; signal the group once stderr shows `iteration`'s line: (status, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.split()[:2] == ["iter", str(iteration)]:
                break
        assert seen and seen[-1].split()[:2] == ["iter", str(iteration)], "".join(seen)
        os.killpg(proc.pid, signum)  # the whole group, as a batch system's walltime signal
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, "".join(seen) + rest


def temporary_stores(tmp) -> list:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("spatialfed-"))


# stop: the resume's --max-iter. 5 in the default run (4 iterations of slack for a signal that lands late): the
# resumed fit must end on the uninterrupted fit's 5th iterate, ℓ and φ (the same steps, to rounding; φ there is
# still ≥ 1e-6 from the 6th and the maximiser), ~9 round trips on the resume's cluster fewer than converging; 30,
# the checkpoint's own, runs the slow cases to convergence
@pytest.mark.parametrize(("signum", "iteration", "stop"), [
    (signal.SIGTERM, 1, 5),
    pytest.param(signal.SIGHUP, 1, 5, marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, 12, 30, marks=pytest.mark.slow),
    pytest.param(signal.SIGHUP, 12, 30, marks=pytest.mark.slow),
])
def test_a_signal_to_the_process_group_keeps_the_fit(sim, uninterrupted, tmp_path, capsys, signum, iteration, stop):
    out, tmp = tmp_path / "fit", tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "spatialfed", "fit", str(sim), "--out", str(out), "--runtime", "dask",
           "--dask-workers", "2", *SETTINGS, "--delays", "exponential:0.05"]
    status, err = signal_at(cmd, iteration, signum, {"TMPDIR": str(tmp)})
    name = signal.Signals(signum).name
    assert status == 128 + signum, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "leaked" not in err, err
    line = (f"spatialfed fit: stopped by {name}; resume with `spatialfed fit --resume {out}` (the checkpoint "
            f"{out / 'checkpoint.zip'} keeps the fit so far)")
    assert err.strip().splitlines()[-1] == line and err.count("stopped by") == 1, err
    assert (out / "checkpoint.zip").exists() and not (out / "fit.json").exists()
    assert temporary_stores(tmp) == []
    assert main(["fit", "--resume", str(out), "--max-iter", str(stop), "--quiet"]) == 0
    resumed = json.loads((out / "fit.json").read_text())
    assert resumed["iterations"] > iteration
    full = uninterrupted(stop)
    assert abs(resumed["loglik"] - full["loglik"]) <= 1e-9
    for name in ("delta", "sigma2", "beta", "gamma"):
        np.testing.assert_allclose(resumed["params"][name], full["params"][name], rtol=1e-7, err_msg=name)


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, pandas as pd
    from spatialfed import FederatedGP

    rng = np.random.default_rng(3)
    n = 120
    frame = pd.DataFrame({"x": rng.uniform(size=n), "y": rng.uniform(size=n), "site": np.repeat([0, 1, 2], n // 3)})
    frame["z"] = np.sin(6 * frame.x) + rng.normal(scale=0.3, size=n)
    gp = FederatedGP(runtime="dask", n_dask_workers=2, mode="sync", preset="tuned", knots=9, max_iter=30, tol=1e-12,
                     delays="exponential:0.05", checkpoint=sys.argv[1], crs="planar", covariates=[])
    gp.fit(frame, "z", groups="site")
""")


def test_a_script_stopped_by_sigterm_removes_its_temporary_store(tmp_path):
    script, tmp, ckpt = tmp_path / "fit_frame.py", tmp_path / "tmp", tmp_path / "ck.pkl"
    script.write_text(SCRIPT)
    tmp.mkdir()
    status, err = signal_at([sys.executable, str(script), str(ckpt)], 1, signal.SIGTERM, {"TMPDIR": str(tmp)})
    assert status != 0 and ckpt.exists(), err  # a script ends as on Ctrl-C (KeyboardInterrupt), its checkpoint kept
    assert temporary_stores(tmp) == [], err
