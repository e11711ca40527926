"""`spatialfed cluster-script`: batch job scripts for SLURM, PBS and SGE, built without submitting or starting."""

import pytest

from spatialfed.cli import main
from spatialfed.runtime.jobscript import PLACEHOLDER_ADDRESS, job_script, load_config

WORKER_CMD = ("distributed.cli.dask_worker", "dask worker")
OPTS = {"cores": 4, "memory": "8GB", "walltime": "00:30:00", "queue": "short", "account": "proj42"}


def has_worker_command(script: str) -> bool:
    return any(cmd in script for cmd in WORKER_CMD)


@pytest.mark.parametrize("kind, directives", [
    ("slurm", ["#SBATCH --cpus-per-task=4", "#SBATCH --mem=8G", "#SBATCH -t 00:30:00", "#SBATCH -p short",
               "#SBATCH -A proj42"]),
    ("pbs", ["#PBS -l walltime=00:30:00", "#PBS -q short", "#PBS -A proj42", "#PBS -l select=1:ncpus=4:mem="]),
    ("sge", ["#$ -l h_rt=00:30:00", "#$ -q short", "#$ -P proj42"]),
])
def test_directives_and_worker_command(kind, directives):
    script = job_script(kind, **OPTS)
    for line in directives:
        assert line in script, (line, script)
    assert has_worker_command(script)
    assert "--nthreads 4" in script
    assert PLACEHOLDER_ADDRESS in script  # no scheduler was started
    assert "export OPENBLAS_NUM_THREADS=1" in script


def test_extra_directives_processes_and_address():
    script = job_script("slurm", cores=4, processes=2, job_extra_directives=["--exclusive", "--constraint=haswell"],
                        scheduler_address="tcp://10.0.0.5:8786")
    assert "#SBATCH --exclusive" in script and "#SBATCH --constraint=haswell" in script
    assert "--nworkers 2" in script and "--nthreads 2" in script
    assert "tcp://10.0.0.5:8786" in script and PLACEHOLDER_ADDRESS not in script


def test_yaml_config_with_system_section(tmp_path):
    cfg = tmp_path / "jobs.yaml"
    cfg.write_text("cores: 8\nmemory: 16GB\nwalltime: '02:00:00'\naccount: flat\njobs: 6\n"
                   "job-extra-directives: ['--exclusive']\n"
                   "slurm:\n  queue: gpu\n  account: slurmacct\n"
                   "pbs:\n  queue: workq\n")
    assert load_config(cfg, "slurm")["account"] == "slurmacct"
    assert load_config(cfg, "pbs")["account"] == "flat"
    slurm = job_script("slurm", config=cfg)
    # 16 GB = 14.9 GiB: dask-jobqueue writes --mem=15G
    for line in ("#SBATCH --cpus-per-task=8", "#SBATCH --mem=15G", "#SBATCH -t 02:00:00", "#SBATCH -p gpu",
                 "#SBATCH -A slurmacct", "#SBATCH --exclusive"):
        assert line in slurm, line
    pbs = job_script("pbs", config=cfg, walltime="00:10:00")  # explicit options override the file
    assert "#PBS -q workq" in pbs and "#PBS -A flat" in pbs and "#PBS -l walltime=00:10:00" in pbs


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown batch system 'lsf'.*slurm, pbs, sge"):
        job_script("lsf")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cores: 2\nno_such_setting: 1\n")
    with pytest.raises(ValueError, match="no_such_setting"):
        job_script("slurm", config=bad)
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        job_script("slurm", config=bad)


def test_cli_prints_script(capsys, tmp_path):
    assert main(["cluster-script", "slurm", "--cores", "4", "--memory", "8GB", "--walltime", "00:30:00",
                 "--queue", "short", "--account", "proj42", "--jobs", "3", "--job-extra=--exclusive"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/usr/bin/env bash")
    for line in ("#SBATCH --cpus-per-task=4", "#SBATCH --mem=8G", "#SBATCH -t 00:30:00", "#SBATCH -p short",
                 "#SBATCH -A proj42", "#SBATCH --exclusive"):
        assert line in out
    assert has_worker_command(out)
    assert "--jobs 3" in err and "3 job(s)" in err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("queue: long\n")
    assert main(["cluster-script", "pbs", "--config", str(cfg)]) == 0
    assert "#PBS -q long" in capsys.readouterr().out
    assert main(["cluster-script", "lsf"]) == 1
    assert "unknown batch system 'lsf'" in capsys.readouterr().err


def test_same_script_as_the_fit_cluster():
    """The printed script is what `fit --jobqueue` (cluster.jobqueue_cluster) submits, up to the scheduler address."""
    from spatialfed.runtime.cluster import jobqueue_cluster

    handle = jobqueue_cluster("slurm", jobs=0, **OPTS)
    try:
        real = handle.cluster.job_script()
        address = handle.cluster.scheduler_address
    finally:
        handle.close()
    assert job_script("slurm", scheduler_address=address, **OPTS) == real


def test_fit_cli_reads_a_yaml_job_configuration(tmp_path):
    """`fit --jobqueue slurm --jobqueue-config FILE`: file values, overridden by options given on the command line."""
    from spatialfed.cli import build_parser
    from spatialfed.cli.args import jobqueue_settings

    config = tmp_path / "jobs.yaml"
    config.write_text("memory: 16GB\nslurm:\n  cores: 8\n  queue: short\n")
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--jobqueue", "slurm", "--jobqueue-config",
                                      str(config), "--jobs", "3", "--account", "geo", "--cores", "4"])
    jq = jobqueue_settings(args)
    assert (jq["kind"], jq["memory"], jq["cores"], jq["queue"], jq["account"], jq["jobs"]) == \
        ("slurm", "16GB", 4, "short", "geo", 3)


def test_the_users_dask_jobqueue_configuration_is_respected_and_flags_override_it_only_when_given():
    """~/.config/dask/jobqueue.yaml (here: dask.config.set, what that file feeds) sets memory and queue; spatialfed's
    own defaults do not overwrite them, an option given on the command line does."""
    import dask

    from spatialfed.runtime.jobscript import DEFAULTS, resolve_options

    with dask.config.set({"jobqueue.slurm.memory": "64GB", "jobqueue.slurm.queue": "long", "jobqueue.slurm.cores": 8}):
        got = resolve_options("slurm")
        assert (got["memory"], got["queue"], got["cores"]) == ("64GB", "long", 8)
        assert got["walltime"] == DEFAULTS["walltime"]  # not set by the user: spatialfed's default
        given = resolve_options("slurm", memory="16GB", queue=None)
        assert (given["memory"], given["queue"]) == ("16GB", "long")  # a flag overrides; an absent one does not
    assert resolve_options("slurm")["memory"] == DEFAULTS["memory"]  # without the user's configuration
