"""Scripts without `if __name__ == "__main__":` (api.scripts): spawned worker processes do not re-run the script.

Each test writes a small script and runs it in a fresh interpreter, as a user would."""

import subprocess
import sys
import textwrap

import pytest

from spatialfed import FederatedGP
from spatialfed.api.scripts import GUARD_MESSAGE, ScriptGuardError


def run_script(tmp_path, body: str, timeout: float = 300) -> subprocess.CompletedProcess:
    path = tmp_path / "user_script.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_spawned_children_do_not_rerun_an_unguarded_script(tmp_path):
    """spawn_safe: a spawn-method child started at the script's top level does not re-run the script; without it
    the child re-runs it (the failure FederatedGP used to meet: one traceback per worker process)."""
    result = run_script(tmp_path, """
        import multiprocessing, os
        from spatialfed.api.scripts import spawn_safe
        print("top level ran in", multiprocessing.current_process().name, flush=True)
        ctx = multiprocessing.get_context("spawn")
        with spawn_safe():
            p = ctx.Process(target=os.getpid)
            p.start(); p.join()
        print("child exit code", p.exitcode, flush=True)
        q = ctx.Process(target=os.getpid)   # the same without spawn_safe: the child re-runs this file and fails
        q.start(); q.join()
        print("unguarded child exit code", q.exitcode, flush=True)
        """)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr
    assert "child exit code 0" in lines
    assert "unguarded child exit code 1" in lines and "if __name__ == '__main__'" in result.stderr
    # the top level ran in the parent, once more in the unguarded child only (which then failed at q.start())
    assert sum(line.startswith("top level ran") for line in lines) == 2


def test_a_child_reaching_the_check_while_it_starts_gets_one_line(tmp_path):
    """A spawned child re-running an unguarded script (a process of the user's own) meets one line naming the fix."""
    result = run_script(tmp_path, """
        import multiprocessing, os
        from spatialfed.api.scripts import check_not_bootstrapping
        try:
            check_not_bootstrapping()   # what FederatedGP.fit does first
            print(multiprocessing.current_process().name, "ok", flush=True)
        except Exception as exc:
            print(multiprocessing.current_process().name, type(exc).__name__, exc, flush=True)
        p = multiprocessing.get_context("spawn").Process(target=os.getpid)
        p.start(); p.join()
        """)
    parent, child = result.stdout.splitlines()[:2]
    assert parent == "MainProcess ok"
    assert "ScriptGuardError" in child and GUARD_MESSAGE in child


def test_fit_checks_first(monkeypatch):
    """fit refuses at once inside a child's start-up, before reading any data."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(ScriptGuardError, match="__name__"):
        FederatedGP(cluster="simulated").fit("missing.zarr")


@pytest.mark.slow  # starts a Dask LocalCluster (about 20-40 s on a shared 2-core machine)
def test_unguarded_script_fits_on_the_embedded_cluster(tmp_path):
    """The README's Python snippet saved as a script, without the guard: fits on the embedded Dask cluster with no
    traceback, and the script's top level runs once (the worker processes do not re-run it)."""
    result = run_script(tmp_path, """
        from spatialfed import Cluster, FederatedGP
        from spatialfed.data.simulate import simulate_store
        print("top level", flush=True)
        simulate_store("sim.zarr", 2, 40, seed=1, test_size=0)
        gp = FederatedGP(mode="sync", knots=9, max_iter=2, cluster=Cluster(n_workers=2), progress=False).fit("sim.zarr")
        print("fitted", gp.n_iter_, gp.variogram_params_["nugget"] > 0, flush=True)
        """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stdout.splitlines() == ["top level", "fitted 2 True"]
