"""`spatialfed cluster-script`: print the batch script `spatialfed fit --jobqueue KIND` would submit per job."""

from __future__ import annotations

import sys

NAME = "cluster-script"
HELP = "print the batch job script of a dask-jobqueue worker (inspect before `fit --jobqueue`)"


def register(subparsers) -> None:
    """Register `spatialfed cluster-script slurm|pbs|sge`."""
    from spatialfed.runtime.cluster import JOBQUEUE_KINDS

    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Builds the dask-jobqueue job for the batch system and prints its script: the directives "
                    "(cores, memory, walltime, queue, account, extra directives) and the `dask worker` command. "
                    "Nothing is submitted and no scheduler is started, so the script names a placeholder scheduler "
                    "address unless --scheduler-address is given.")
    p.add_argument("kind", metavar="SYSTEM", help=f"batch system: {' | '.join(JOBQUEUE_KINDS)}")
    p.add_argument("--cores", type=int, default=None, help="cores (worker threads) per job (default 1)")
    p.add_argument("--memory", default=None, help="memory per job, e.g. 8GB (default 4GB)")
    p.add_argument("--walltime", default=None, help="walltime per job, HH:MM:SS (default 01:00:00)")
    p.add_argument("--queue", default=None, help="queue / partition")
    p.add_argument("--account", default=None, help="account / project to charge (SGE: project, -P)")
    p.add_argument("--processes", type=int, default=None,
                   help="Dask worker processes per job (default 1, as `spatialfed fit --jobqueue` uses)")
    p.add_argument("--jobs", type=int, default=None, help="how many such jobs the fit would submit (default 1)")
    p.add_argument("--job-extra", action="append", default=None, metavar="DIRECTIVE",
                   help="extra scheduler directive, repeatable, e.g. --job-extra=--exclusive "
                        "(written after the #SBATCH/#PBS/#$ prefix)")
    p.add_argument("--interface", default=None, help="network interface the workers (and scheduler) use, e.g. ib0")
    p.add_argument("--scheduler-address", default=None, metavar="ADDRESS",
                   help="scheduler address to write into the worker command (default: a placeholder)")
    p.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="YAML file of the same settings (cores, memory, walltime, queue, account, processes, jobs, "
                        "job_extra_directives, job_script_prologue, ...; optional per-system sections); "
                        "command-line options override it")
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed cluster-script`: the script on stdout, the job count on stderr."""
    from spatialfed.runtime.jobscript import check_kind, job_script, resolve_options

    kind = check_kind(args.kind)
    options = {"cores": args.cores, "memory": args.memory, "walltime": args.walltime, "queue": args.queue,
               "account": args.account, "processes": args.processes, "jobs": args.jobs,
               "job_extra_directives": args.job_extra, "interface": args.interface}
    script = job_script(kind, config=args.config, scheduler_address=args.scheduler_address, **options)
    jobs = resolve_options(kind, args.config, **options)["jobs"]
    sys.stdout.write(script if script.endswith("\n") else script + "\n")
    sys.stdout.flush()
    print(f"spatialfed cluster-script: `spatialfed fit --jobqueue {kind} --jobs {jobs}` submits {jobs} job(s) "
          "like this one", file=sys.stderr)
