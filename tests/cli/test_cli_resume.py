"""`spatialfed fit --resume DIR`: options given on the command line override the checkpoint's values, defaults do not.

Issue 16's bug: `fit --resume DIR --max-iter 50` ignored the explicit 50 whenever the checkpoint held another value
(50 is --max-iter's default, and "equal to the default" was taken for "not given").
"""

import json
import shutil
import signal
import threading
import time

import pytest

from spatialfed.algorithm.checkpoint import read_checkpoint
from spatialfed.cli import main
from spatialfed.errors import SpatialFedError

FIRST_MAX_ITER = 30  # the checkpoint's value: more than the interrupted run can reach before Ctrl-C
#: async on Dask (the paper preset keeps moving by ~1e-3, so tol 1e-12 never stops it), a checkpoint per aggregation
SETTINGS = ["--mode", "async", "--preset", "paper", "--knots", "9", "--tol", "1e-12", "--checkpoint-every", "1",
            "--quiet"]


@pytest.fixture(scope="module")
def cluster():
    """One running Dask cluster for the interrupted fit of this module and the resumes that continue it (`--scheduler`
    given again: a checkpoint never says where to connect; test_ops_wiring resumes on an embedded cluster)."""
    from spatialfed.runtime.cluster import local_cluster

    with local_cluster(2, security=False) as handle:  # plain TCP: the CLI joins it with --scheduler
        yield handle


def _ctrl_c_once_checkpointed(path, min_t=3, timeout_s=120.0):
    """A thread that sends SIGINT to the main thread (what Ctrl-C does) once `path` holds a mid-fit checkpoint."""
    main_thread = threading.main_thread().ident

    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                snap = read_checkpoint(path)
            except (OSError, SpatialFedError, EOFError):
                snap = None
            if snap is not None and snap["phase"] == "loop" and snap["t"] >= min_t:
                signal.pthread_kill(main_thread, signal.SIGINT)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def interrupted(store, cluster, tmp_path_factory):
    """The output directory of a real `spatialfed fit` stopped by Ctrl-C after a few checkpointed aggregations."""
    out = tmp_path_factory.mktemp("interrupted") / "fit"
    watcher = _ctrl_c_once_checkpointed(out / "checkpoint.zip")
    rc = main(["fit", str(store), "--out", str(out), "--max-iter", str(FIRST_MAX_ITER), *SETTINGS,
               "--scheduler", cluster.client.scheduler.address])
    watcher.join()
    snap = read_checkpoint(out / "checkpoint.zip")
    assert rc == 130 and snap["phase"] == "loop" and 3 <= snap["t"] < FIRST_MAX_ITER
    assert snap["meta"]["params"]["max_iter"] == FIRST_MAX_ITER and not (out / "fit.json").exists()
    return out


def _resume(interrupted, cluster, tmp_path, *flags):
    out = tmp_path / "copy"
    shutil.copytree(interrupted, out)  # each resume continues the same interrupted state
    # --checkpoint-every, given, overrides the checkpoint's 1 too (a write per aggregation is slow)
    assert main(["fit", "--resume", str(out), "--checkpoint-every", "1000", "--quiet", *flags,
                 "--scheduler", cluster.client.scheduler.address]) == 0
    return json.loads((out / "fit.json").read_text())


def test_explicit_max_iter_overrides_the_checkpoint(interrupted, cluster, tmp_path):
    """50 is --max-iter's default, given explicitly: the bug's case."""
    fit = _resume(interrupted, cluster, tmp_path, "--max-iter", "50")
    assert fit["iterations"] == 50 != FIRST_MAX_ITER and not fit["converged"]


def test_without_the_flag_the_checkpoint_value_stands(interrupted, cluster, tmp_path):
    fit = _resume(interrupted, cluster, tmp_path)
    assert fit["iterations"] == FIRST_MAX_ITER


def test_model_options_given_on_resume_are_refused(interrupted, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(interrupted, out)
    assert main(["fit", "--resume", str(out), "--knots", "16", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "knots" in err and "Traceback" not in err
    assert read_checkpoint(out / "checkpoint.zip")["phase"] == "loop"  # untouched


def test_stopping_rules_cannot_extend_a_finished_fit(store, tmp_path, capsys):
    """A checkpoint written after the loop ended resumes to the same fit: an explicit --max-iter is refused rather
    than silently ignored (the virtual clock writes checkpoints too, and fast)."""
    out = tmp_path / "done"
    assert main(["fit", str(store), "--out", str(out), "--runtime", "simulated", "--mode", "sync", "--knots", "9",
                 "--max-iter", "3", "--checkpoint-every", "2", "--quiet"]) == 0
    assert str(read_checkpoint(out / "checkpoint.zip")["phase"]) == "done"
    capsys.readouterr()
    assert main(["fit", "--resume", str(out), "--max-iter", "6", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "holds a finished fit, which --max-iter cannot extend" in err and err.count("\n") == 1
    assert main(["fit", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "fit.json").read_text())["iterations"] == 3


def test_a_directory_with_the_earlier_checkpoint_name_resumes(store, tmp_path, capsys):
    """DIR/checkpoint.pkl (the same archive under its earlier name) is read by `--resume DIR` when DIR holds no
    checkpoint.zip: the fit it keeps is written out again."""
    out = tmp_path / "old"
    assert main(["fit", str(store), "--out", str(out), "--runtime", "simulated", "--mode", "sync", "--knots", "9",
                 "--max-iter", "3", "--checkpoint-every", "1", "--quiet"]) == 0
    first = json.loads((out / "fit.json").read_text())
    (out / "checkpoint.zip").rename(out / "checkpoint.pkl")
    (out / "fit.json").unlink()
    assert main(["fit", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "fit.json").read_text())["params"] == first["params"]
    (out / "checkpoint.pkl").unlink()
    (out / "checkpoint.zip").unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["fit", "--resume", str(out), "--quiet"]) == 1
    assert "checkpoint.zip" in capsys.readouterr().err  # with neither file, the error names the current name


def test_wall_time_after_a_resume_is_the_whole_fits(interrupted, cluster, tmp_path):
    """fit.json's wall_time_s after a resume counts the interrupted run too: the checkpoint records the seconds
    before the interruption, and the result is at least the fit's clock at its last aggregation (on Dask the trace's
    time_s carries on from the interrupted run), at most those seconds plus the resuming command's."""
    before = read_checkpoint(interrupted / "checkpoint.zip")["meta"]["wall_time_s"]
    assert before > 0
    tic = time.perf_counter()
    fit = _resume(interrupted, cluster, tmp_path)
    elapsed = time.perf_counter() - tic
    assert fit["trace"][-1]["time_s"] <= fit["wall_time_s"] <= before + elapsed
    assert fit["wall_time_s"] > before
