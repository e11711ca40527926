"""One writer per `spatialfed fit --out` (spatialfed.outputs.lock): fits started together into one directory (four;
ten, twenty times, in the slow test), exactly one writes and the others are refused with one line each; a lock whose
holder was killed (-9) is free again.

Before, three concurrent fits into one --out all printed "wrote", all exited 0, and one result survived.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from spatialfed.outputs.lock import OutputLockedError, lock_path, output_lock


def concurrent_fits(store, out, n=10) -> list[tuple[int, str, str]]:
    """(status, stdout, stderr) of `n` `spatialfed fit STORE --out OUT` started at once."""
    cmd = [sys.executable, "-m", "spatialfed", "fit", str(store), "--out", str(out), "--knots", "9", "--max-iter",
           "5", "--quiet"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    return [(p.wait(), *p.communicate()) for p in procs]


def check_one_writer(results, out) -> None:
    wrote = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] == 1]
    assert len(wrote) == 1 and wrote[0][1].startswith(f"wrote {out}:"), results
    assert len(refused) == len(results) - 1, results
    for _, stdout, stderr in refused:
        assert stdout == "" and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
        assert stderr.startswith(f"spatialfed fit: error: {out}"), stderr  # being written by pid ..., or exists
    assert json.loads((out / "fit.json").read_text())["iterations"] >= 1
    assert not lock_path(out).exists()


def test_concurrent_fits_into_one_out_have_one_writer(store, tmp_path):
    out = tmp_path / "same"
    check_one_writer(concurrent_fits(store, out, n=4), out)  # ten, twenty times: the slow test below


@pytest.mark.slow
def test_ten_concurrent_fits_twenty_times(store, tmp_path):
    for trial in range(20):
        out = tmp_path / f"same{trial}"
        check_one_writer(concurrent_fits(store, out), out)


HOLDER = textwrap.dedent("""
    import sys, time
    from spatialfed.outputs.lock import output_lock
    with output_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
""")


def test_a_held_lock_names_its_holder_and_a_killed_holder_leaves_it_free(tmp_path):
    out = tmp_path / "fit"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(OutputLockedError, match=rf"being written by another run \(pid {holder.pid} on "):
            with output_lock(out):
                pass
        os.kill(holder.pid, signal.SIGKILL)  # no clean-up runs: the file stays, the kernel drops the flock
        holder.wait()
        assert lock_path(out).exists()
        with output_lock(out) as path:
            assert path.read_text().startswith(f"pid {os.getpid()} on ")
        assert not lock_path(out).exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
