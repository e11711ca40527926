"""Worker lifetimes short of the batch walltime (runtime.walltime): the walltime forms and the margin rule."""

import pytest

from spatialfed.runtime.walltime import lifetime, walltime_seconds, with_lifetime


@pytest.mark.parametrize("text, seconds", [("02:00:00", 7200), ("00:01:00", 60), ("1-12:00:00", 129600),
                                           ("30:00", 1800), ("90", 5400), (45, 45), (None, None)])
def test_walltime_forms(text, seconds):
    assert walltime_seconds(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "-01:00:00", "01:-5:00"])
def test_a_bad_walltime_names_the_forms(bad):
    with pytest.raises(ValueError, match=r"\[D-\]HH:MM:SS"):
        walltime_seconds(bad)


@pytest.mark.parametrize("walltime, expected", [
    ("02:00:00", (6600, 300)),      # margin W/10 = 720 s, held to 600 s
    ("00:30:00", (1620, 90)),       # margin W/10 = 180 s
    ("00:01:00", (50, 5)),          # margin W/10 = 6 s, raised to 10 s
    ("00:00:20", (10, 5)),          # margin 10 s = W/2
    ("00:00:15", (7.5, 3.75)),      # margin held to W/2
])
def test_every_worker_retires_before_the_walltime(walltime, expected):
    seconds, stagger = lifetime(walltime)
    assert (seconds, stagger) == pytest.approx(expected)
    assert seconds + stagger < walltime_seconds(walltime) and seconds - stagger > 0


def test_the_lifetime_goes_to_the_worker_command_and_a_users_own_wins():
    kw = with_lifetime({"cores": 1, "worker_extra_args": ["--resources", "gpu=1"]}, "00:30:00")
    assert kw["worker_extra_args"] == ["--resources", "gpu=1", "--lifetime", "1620s", "--lifetime-stagger", "90s"]
    own = {"worker_extra_args": ["--lifetime=20m"]}
    assert with_lifetime(own, "00:30:00") == own
    assert with_lifetime({"cores": 1}, None) == {"cores": 1}


def test_generations_of_jobs_count_the_jobs_that_started_after_others_ended():
    import sys
    from datetime import datetime, timedelta
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from slurm_jobs import Job, generations

    t0 = datetime(2026, 1, 1)

    def job(i, start, end):
        return Job(i, "dask-worker", "COMPLETED", t0 + timedelta(seconds=start),
                   None if end is None else t0 + timedelta(seconds=end))

    first = [job(1, 0, 60), job(2, 0, 58)]
    assert generations(first) == 1
    assert generations([*first, job(3, 59, 120), job(4, 61, None)]) == 2  # 3 follows job 2, 4 follows both
    assert generations([*first, job(3, 59, 120), job(5, 121, None)]) == 3
    assert generations([Job(6, "dask-worker", "PENDING", None, None)]) == 0
