"""Batch job scripts for the dask-jobqueue runtime: what `spatialfed fit --jobqueue KIND` would submit, without
submitting anything or starting a scheduler.

``job_script("slurm", cores=4, memory="8GB", walltime="02:00:00", queue="short", account="proj42")`` returns the
script text. It is built by the dask-jobqueue ``Job`` class of the batch system — the same object a
``SLURMCluster``/``PBSCluster``/``SGECluster`` builds for its own ``cluster.job_script()`` (its "dummy job") — from
the keyword arguments that ``jobqueue_kwargs`` assembles with the conventions of ``cluster.jobqueue_cluster``:
one Dask worker process per job by default, ``cores`` threads, BLAS/OpenMP held to one thread and glibc's malloc
settings (``cluster.JOB_ENV``, exported in the prologue), ``account`` charged as ``-A`` (SLURM, PBS) or as the
project ``-P`` (SGE). Since no scheduler runs, the worker command names the placeholder address
``tcp://<insert-scheduler-address-here>:8786`` unless ``scheduler_address`` is given; `spatialfed fit` fills in the
real address of the scheduler it starts.

Settings can also come from a YAML file (``load_config``): a flat mapping of the same keys (``cores``, ``memory``,
``walltime``, ``queue``, ``account``, ``processes``, ``jobs``, ``job_extra_directives``, ``job_script_prologue``,
``interface``, ``local_directory``, ``log_directory``, ...; ``-`` and ``_`` are interchangeable), optionally with a
section per batch system (``slurm: {queue: short}``) that overrides the flat keys for that system.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from spatialfed.runtime.cluster import JOB_ENV, JOBQUEUE_KINDS, import_dask_jobqueue, on_loopback
from spatialfed.runtime.walltime import with_lifetime

PLACEHOLDER_ADDRESS = "tcp://<insert-scheduler-address-here>:8786"

#: settings with a spatialfed default (the defaults of `spatialfed fit --jobqueue`)
DEFAULTS = {"cores": 1, "memory": "4GB", "walltime": "01:00:00", "queue": None, "account": None, "processes": 1,
            "jobs": 1}
#: keys that describe the submission, not one job's script
SUBMISSION_KEYS = ("jobs",)


def check_kind(kind: str) -> str:
    """Lower-cased batch system name; ValueError naming the supported ones otherwise."""
    name = str(kind).strip().lower()
    if name not in JOBQUEUE_KINDS:
        raise ValueError(f"unknown batch system {kind!r}; spatialfed supports {', '.join(JOBQUEUE_KINDS)} "
                         "(dask-jobqueue's SLURMCluster, PBSCluster, SGECluster)")
    return name


def _normalise_keys(mapping: Mapping, where: str) -> dict:
    out = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: setting names must be strings, got {key!r}")  # noqa: TRY004 (CLI reports ValueError)
        out[key.strip().replace("-", "_")] = value
    return out


def load_config(path, kind: str | None = None) -> dict:
    """Settings from a YAML file: flat keys, overridden by the section named after `kind` (e.g. ``slurm:``)."""
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read job configuration {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"job configuration {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"job configuration {path} must be a mapping of settings (cores: 4, memory: 8GB, ...), "  # noqa: TRY004
                         f"got {type(data).__name__}")
    data = dict(data)
    if isinstance(data.get("jobqueue"), Mapping):  # dask-jobqueue's own layout: jobqueue: {slurm: {...}}
        data = {**{k: v for k, v in data.items() if k != "jobqueue"}, **data["jobqueue"]}
    sections = {name: data.pop(name) for name in JOBQUEUE_KINDS if name in data}
    flat = _normalise_keys(data, str(path))
    if kind is not None:
        section = sections.get(check_kind(kind)) or {}
        if not isinstance(section, Mapping):
            raise ValueError(f"{path}: section {kind!r} must be a mapping of settings")
        flat.update(_normalise_keys(section, f"{path} [{kind}]"))
    return flat


def user_dask_config(kind: str) -> dict:
    """The job settings the user put in Dask's own configuration for `kind` (``~/.config/dask/jobqueue.yaml``,
    ``DASK_JOBQUEUE__SLURM__MEMORY`` ...): those of DEFAULTS' keys whose value differs from dask-jobqueue's shipped
    defaults, so that a site's or user's configuration is respected rather than overwritten by spatialfed's."""
    import os

    import dask
    import yaml

    dask_jobqueue = import_dask_jobqueue()  # not a bare import: it would replace this process's Ctrl-C handler

    kind = check_kind(kind)
    with open(os.path.join(os.path.dirname(dask_jobqueue.__file__), "jobqueue.yaml")) as fh:
        shipped = (yaml.safe_load(fh) or {}).get("jobqueue", {}).get(kind, {}) or {}
    current = dask.config.get(f"jobqueue.{kind}", default={}) or {}
    return {key.replace("-", "_"): value for key, value in current.items()
            if key.replace("-", "_") in DEFAULTS and value is not None and value != shipped.get(key)}


def resolve_options(kind: str, config=None, **options) -> dict:
    """DEFAULTS < the user's Dask configuration (user_dask_config) < YAML `config` (path or mapping) < explicit
    `options` (None values do not override): command-line flags override a user's configuration only when given."""
    kind = check_kind(kind)
    if config is None:
        from_file = {}
    elif isinstance(config, Mapping):
        from_file = _normalise_keys(config, "config")
    else:
        from_file = load_config(config, kind)
    given = {k: v for k, v in _normalise_keys(options, "options").items() if v is not None}
    return {**DEFAULTS, **user_dask_config(kind), **from_file, **given}


def jobqueue_kwargs(kind: str, *, cores=1, memory="4GB", walltime="01:00:00", queue=None, account=None,
                    processes=1, interface=None, job_extra_directives=None, job_script_prologue=None,
                    **job_kwargs) -> dict:
    """Keyword arguments of the dask-jobqueue cluster / job class for `kind`, spatialfed's conventions
    (those of ``cluster.jobqueue_cluster``): BLAS single-threaded and glibc's malloc settings in the prologue,
    account → ``-A`` / SGE ``-P``, workers retiring before the walltime (runtime.walltime)."""
    kind = check_kind(kind)
    cores, processes = int(cores), int(processes)
    if cores < 1 or processes < 1 or processes > cores:
        raise ValueError(f"need cores >= processes >= 1, got cores={cores}, processes={processes}")
    prologue = [f"export {k}={v}" for k, v in JOB_ENV.items()] + list(job_script_prologue or [])
    kw = dict(cores=cores, processes=processes, memory=str(memory), walltime=str(walltime), queue=queue,
              job_script_prologue=prologue, **job_kwargs)
    if job_extra_directives:
        if isinstance(job_extra_directives, str):
            job_extra_directives = [job_extra_directives]
        kw["job_extra_directives"] = [str(d) for d in job_extra_directives]
    if account is not None:
        kw["account" if kind in ("slurm", "pbs") else "project"] = str(account)
    if interface is not None:
        kw["interface"] = interface
    return with_lifetime(kw, walltime)


def job_class(kind: str):
    """The dask-jobqueue Job class of a batch system (SLURMJob, PBSJob, SGEJob)."""
    dask_jobqueue = import_dask_jobqueue()

    cluster_cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster,
                   "sge": dask_jobqueue.SGECluster}[check_kind(kind)]
    return cluster_cls.job_cls


def job_script(kind: str, *, config=None, scheduler_address: str | None = None, **options) -> str:
    """The batch script of one Dask-worker job for `kind` ("slurm" | "pbs" | "sge"); nothing is submitted or started.

    `options`: cores, memory, walltime, queue, account, processes, job_extra_directives, job_script_prologue,
    interface and any other dask-jobqueue job keyword; `config`: a YAML file (or mapping) of the same settings,
    overridden by explicit options. `jobs` is accepted and ignored here (it is how many such scripts are submitted).
    """
    kind = check_kind(kind)
    settings = resolve_options(kind, config, **options)
    for key in SUBMISSION_KEYS:
        settings.pop(key, None)
    kw = jobqueue_kwargs(kind, **settings)
    if scheduler_address and "interface" not in kw:  # as jobqueue_cluster: workers of a loopback scheduler
        kw = on_loopback(kw, urlsplit(scheduler_address).hostname)
    cls = job_class(kind)
    try:
        placeholder = PLACEHOLDER_ADDRESS
        if str(kw.get("protocol") or "").startswith("tls"):
            placeholder = placeholder.replace("tcp://", "tls://", 1)
        job = cls(scheduler_address or placeholder, name="dummy-name", **kw)
    except TypeError as exc:  # an unknown keyword, most likely from the YAML file
        raise ValueError(f"invalid {kind} job setting: {exc}") from exc
    return job.job_script()
