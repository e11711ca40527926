"""Ctrl-C in a terminal during `spatialfed fit` on the embedded LocalCluster (issue 28, item 4).

A terminal sends SIGINT to its whole foreground process group, the LocalCluster's worker processes included. The
test starts a real `python -m spatialfed fit` in a process group of its own, waits for its first iteration line on
stderr (no fixed sleep), then signals the whole group with os.killpg, as a terminal does: exit status 130, one line
naming the resume command, no traceback of any process (the workers' `Process Dask Worker process (from Nanny)`
tracebacks were ~50 lines each).
"""

import os
import signal
import subprocess
import sys

from spatialfed.data.simulate import simulate_store


def test_ctrl_c_to_the_process_group_prints_one_resume_line(tmp_path):
    store, out = tmp_path / "s.zarr", tmp_path / "fit"
    simulate_store(store, 3, 40, test_size=0, seed=3)
    # every task waits ~0.5 s more (--delays): the fit is still running long after its first iteration line
    cmd = [sys.executable, "-m", "spatialfed", "fit", str(store), "--out", str(out), "--runtime", "dask",
           "--dask-workers", "2", "--knots", "9", "--max-iter", "200", "--tol", "1e-12",
           "--delays", "exponential:0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.lstrip().startswith("iter"):
                break
        assert seen and seen[-1].lstrip().startswith("iter"), "".join(seen)
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as a terminal's Ctrl-C
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    line = (f"spatialfed fit: interrupted; resume with `spatialfed fit --resume {out}` (the checkpoint "
            f"{out / 'checkpoint.zip'} keeps the fit so far)")
    assert rest.strip().splitlines()[-1] == line and err.count("spatialfed fit: interrupted") == 1, err
    assert (out / "checkpoint.zip").exists() and not (out / "fit.json").exists()
