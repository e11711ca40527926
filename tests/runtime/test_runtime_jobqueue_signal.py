"""Importing dask-jobqueue must not change what Ctrl-C does (issue 15: Ctrl-C stops a fit with a checkpoint, 130).

dask_jobqueue.runner (imported by ``import dask_jobqueue``) installs ``signal.signal(SIGINT, lambda *_: sys.exit())``
at import: Ctrl-C then raised SystemExit, which `spatialfed fit --jobqueue ...` did not treat as an interruption, and
which made every later Ctrl-C test in the same pytest process fail. Checked in a fresh interpreter (the import runs
once per process).
"""

import subprocess
import sys

CODE = """
import signal
{first}
from spatialfed.runtime.cluster import import_dask_jobqueue
import_dask_jobqueue()
try:
    signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


def _ctrl_c(first: str) -> str:
    done = subprocess.run([sys.executable, "-c", CODE.format(first=first)], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or done.stderr.strip()


def test_importing_dask_jobqueue_keeps_ctrl_c_a_keyboard_interrupt():
    assert _ctrl_c("") == "KeyboardInterrupt"


def test_a_handler_dask_jobqueue_installed_earlier_is_undone():
    assert _ctrl_c("import dask_jobqueue") == "KeyboardInterrupt"


def test_the_job_script_helpers_keep_ctrl_c_a_keyboard_interrupt():
    """runtime/jobscript.py reads dask-jobqueue's defaults and job classes: through import_dask_jobqueue too."""
    code = """
import signal
from spatialfed.runtime import jobscript
jobscript.job_class("slurm")
try:
    signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.stdout.strip() or done.stderr.strip()) == "KeyboardInterrupt"
