"""The estimator's setting objects besides the model and fit settings: where a Dask fit runs (`Cluster`), what an
experiment emulates (`Emulation`) and where its checkpoint goes (`Checkpoint`), with the spellings of earlier
versions mapped onto them.

    FederatedGP(cluster="dask")                                      # an embedded LocalCluster, whatever the size
    FederatedGP(cluster="tcp://10.0.0.5:8786")                       # a running scheduler
    FederatedGP(cluster=client)                                      # a distributed.Client (not closed)
    FederatedGP(cluster=Cluster(n_workers=4, tls=True))              # an embedded LocalCluster
    FederatedGP(cluster=Cluster(jobqueue={"kind": "slurm", "cores": 4, "memory": "8GB"}))
    FederatedGP(cluster="simulated")                                 # in this process, on a virtual clock
    FederatedGP(cluster="simulated", emulation=Emulation(profile="straggler", delays="exponential:0.5"))
    FederatedGP(checkpoint=Checkpoint("run1/fit.ckpt", every=5))         # or checkpoint="run1/fit.ckpt"
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, fields, replace

from spatialfed.errors import option
from spatialfed.runtime.factory import ALIASES, RUNTIMES, runtime_name
from spatialfed.runtime.interface import Runtime

ON_WORKER_ERROR = ("stop", "drop")


@dataclass(frozen=True)
class Cluster:
    """Where a fit runs. `runtime`: "auto" (in this process for small jobs without a Dask setting, else Dask:
    runtime.factory.choose_runtime), "dask", "simulated" (in this process, on a virtual clock) or a
    spatialfed.runtime Runtime object. The rest is where a Dask fit runs: `address`: a running scheduler (tcp://host:port or tls://...; None: an embedded
    LocalCluster, or dask-jobqueue with `jobqueue`); `client`: an existing distributed.Client (not closed by the
    estimator; not with tls); `n_workers`: processes of the embedded LocalCluster (default min(J, usable cores));
    `jobqueue`: a dict for runtime.cluster.jobqueue_cluster ({"kind": "slurm", "cores": 4, ...}); `tls`: encrypt
    and authenticate every connection (True: a temporary self-signed certificate; a directory holding
    ca.pem/cert.pem/key.pem); `insecure`: allow a plain-TCP scheduler off this machine (docs/hpc.md); `timeout`:
    seconds to wait for the scheduler; `on_worker_error`: "stop" (a failing site stops the fit, naming it) or "drop"
    (continue without it, recorded in dropped_workers_)."""

    address: str | None = None
    client: object | None = None
    n_workers: int | None = None
    jobqueue: dict | None = None
    tls: bool | str | None = None
    insecure: bool = False
    timeout: float = 5.0
    on_worker_error: str = "stop"
    runtime: object = "auto"

    def __post_init__(self):
        name = runtime_name(self.runtime)  # a name or a Runtime; the choices listed otherwise
        here = option("cluster='simulated'", "--runtime simulated")
        if name == "simulated" and (self.address or self.client is not None or self.jobqueue):
            raise ValueError(f"{here} runs in this process; a scheduler address, client or jobqueue runs on Dask: "
                             f"{option('give Cluster(address=, client= or jobqueue=) alone', 'leave --runtime out')}")
        if name == "simulated" and self.tls not in (None, False):
            raise ValueError(f"tls applies to the Dask connections; {here} has none")
        if self.on_worker_error not in ON_WORKER_ERROR:
            raise ValueError(f"on_worker_error must be one of {ON_WORKER_ERROR}, got {self.on_worker_error!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"address must be a scheduler address such as 'tcp://host:8786', got {self.address!r}")
        if self.client is not None and (self.address or self.jobqueue):
            raise ValueError("client= is a connection already made: give it alone, without address or jobqueue")

    @property
    def given(self) -> list[str]:
        """The Dask options set (they make runtime "auto" choose Dask)."""
        return [name for name, on in (("client", self.client is not None), ("address", self.address),
                                      ("jobqueue", self.jobqueue), ("tls", self.tls not in (None, False)),
                                      ("on_worker_error='drop'", self.on_worker_error == "drop"),
                                      ("n_workers", self.n_workers is not None)) if on]

    def saved(self) -> dict:
        """Its settings as plain values (checkpoint meta, fit.json), without the live client (a Runtime object
        by its name)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "client"}
        out["runtime"] = runtime_name(self.runtime)
        return out


@dataclass(frozen=True)
class Emulation:
    """What an experiment emulates (docs/delays.md): the sites' compute heterogeneity, `profile` ("balanced" |
    "straggler" | "graded" | "graded:<min cores>") or explicit `slowdown` factors s_1..s_J ≥ 1; `delays` and
    `activations` (runtime.delays objects or their command-line strings, "exponential:0.5", "poisson:RATE"; drawn
    with the estimator's seed); `n_sites`: the number of owners J of the automatic area partition of in-memory data
    given without groups (default: about 500 rows per site, 4 to 64 sites; data.partition.default_sites)."""

    profile: str = "balanced"
    slowdown: tuple | None = None
    delays: object | None = None
    activations: object | None = None
    n_sites: int | None = None

    @property
    def given(self) -> list[str]:
        """The emulation options set (they make runtime "auto" choose Dask)."""
        return [name for name, on in (("profile/slowdown", self.slowdown is not None or self.profile != "balanced"),
                                      ("delays/activations", self.delays is not None or self.activations is not None))
                if on]

    def saved(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Checkpoint:
    """Where a Dask fit keeps its checkpoint (docs/recovery.md): the file `path`, written atomically every `every`
    aggregations (None: every 10, further apart when a write costs more than 5 % of the wall time), when the fit is
    interrupted, and once at the end."""

    path: str
    every: int | None = None

    def __post_init__(self):
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise ValueError(f"Checkpoint needs the path of the file to write, got {self.path!r}")
        object.__setattr__(self, "path", str(self.path))
        K = self.every
        if K is not None and (isinstance(K, bool) or not isinstance(K, (int, float)) or not float(K).is_integer()
                              or K < 1):
            raise ValueError(f"{option('Checkpoint(path, every=K)', '--checkpoint-every K')}: K must be a positive "
                             f"integer (aggregations), got {K!r}")

    def saved(self) -> dict:
        return asdict(self)


def cluster_of(value) -> Cluster:
    """The Cluster of a ``cluster=`` value: None (defaults), a Cluster, a runtime name ("auto", "dask",
    "simulated") or Runtime object, a scheduler address, a distributed.Client, or a dict of Cluster's settings."""
    if hasattr(value, "scheduler") and hasattr(value, "submit"):
        return Cluster(client=value)  # a distributed.Client
    if isinstance(value, Runtime) or (isinstance(value, str) and value in RUNTIMES + tuple(ALIASES)):
        return Cluster(runtime=value)
    if isinstance(value, str) and ":" not in value:  # neither a runtime nor host:port
        raise ValueError(f"cluster must be one of {RUNTIMES[1:]}, a scheduler address such as 'tcp://host:8786', a "
                         f"distributed.Client or a spatialfed.Cluster, got {value!r}")
    return _coerced(value, Cluster, "address", "a scheduler address, a distributed.Client, a spatialfed.Cluster")


def emulation_of(value) -> Emulation:
    """The Emulation of an ``emulation=`` value: None (none), an Emulation, a profile name, or a dict."""
    return _coerced(value, Emulation, "profile", "a spatialfed.Emulation, a profile name")


def checkpoint_of(value) -> Checkpoint | None:
    """The Checkpoint of a ``checkpoint=`` value: None (none), a Checkpoint, a path, or a dict of its settings."""
    if value is None:
        return None
    return _coerced(os.fspath(value) if isinstance(value, os.PathLike) else value, Checkpoint, "path",
                    "a file path, a spatialfed.Checkpoint")


def _coerced(value, cls, text_field: str, what: str):
    """`cls` of None (its defaults), an instance, a string (its `text_field`) or a dict of its settings."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        return cls(**{text_field: value})
    if isinstance(value, dict):
        return cls(**value)
    raise ValueError(f"{cls.__name__.lower()} must be {what} or a dict of its settings, got {type(value).__name__}")


#: Cluster fields that say where to connect, what to submit and how securely: never read from a file
CONNECTION = ("address", "client", "jobqueue", "tls", "insecure")


def recorded_cluster(value) -> tuple[Cluster, dict]:
    """(the Cluster a checkpoint or fit directory may set: its worker count, timeout and on_worker_error; the
    connection settings it recorded, to be named, never used) of a recorded ``cluster`` value."""
    plain = value.saved() if isinstance(value, Cluster) else value if isinstance(value, dict) else {}
    kept = Cluster(**{k: v for k, v in plain.items() if k not in CONNECTION})
    return kept, {k: v for k, v in plain.items() if k in CONNECTION and v}


#: constructor parameters of earlier versions -> (the object, its field)
MOVED = {"scheduler": ("cluster", "address"), "client": ("cluster", "client"),
         "n_dask_workers": ("cluster", "n_workers"), "jobqueue": ("cluster", "jobqueue"), "tls": ("cluster", "tls"),
         "insecure": ("cluster", "insecure"), "scheduler_timeout": ("cluster", "timeout"),
         "on_worker_error": ("cluster", "on_worker_error"), "runtime": ("cluster", "runtime"), "profile": ("emulation", "profile"),
         "slowdown": ("emulation", "slowdown"), "delays": ("emulation", "delays"),
         "activations": ("emulation", "activations"), "n_sites": ("emulation", "n_sites")}
_SPELLING = {"cluster": "Cluster", "emulation": "Emulation"}
#: parameters of earlier versions folded into another parameter -> (it, how the value maps, the new spelling: a
#: string, or a function of the folded value)
FOLDED = {"live": ("progress", lambda v, old: "live" if v else old, "progress='live'"),
          "fgpr": ("strategies", lambda v, old: {**_dict(old), **(v or {})}, "strategies={...} (method='fgpr')"),
          "secure_aggregation": ("privacy", lambda v, old: _secure(v, old), "privacy='secure_aggregation'"),
          "vecchia_k": ("residual", lambda v, old: _with_k(v, old), lambda new: f"residual={new!r}"),
          "checkpoint_every": ("checkpoint", lambda v, old: _every(v, old),
                               "checkpoint=Checkpoint(path, every=...) (from spatialfed import Checkpoint)"),
          "agg_threshold": ("strategies", lambda v, old: old if v is None else {**_dict(old), "agg_threshold": v},
                            "strategies={'agg_threshold': ...}"),
          "preset": ("strategies", lambda v, old: _with_preset(v, old), lambda new: f"strategies={new!r}")}


def scheme_of(strategies) -> tuple[str | None, dict]:
    """(preset, further settings) of a ``strategies=`` value: None (the default scheme), a preset name ("stats",
    "tuned", "paper", "basic", "section5": algorithm/config.py FitConfig.preset) or a dict of settings, with the
    preset under "preset"."""
    if strategies is None or isinstance(strategies, str):
        return strategies, {}
    if isinstance(strategies, dict):
        return strategies.get("preset"), {k: v for k, v in strategies.items() if k != "preset"}
    raise ValueError(f"strategies must be a preset name (e.g. 'tuned') or a dict of settings, e.g. "
                     f"{{'preset': 'tuned', 'correction': False}}, got {type(strategies).__name__}")


def _dict(strategies) -> dict:
    """A ``strategies=`` value as one dict (its preset under "preset")."""
    preset, extra = scheme_of(strategies)
    return extra if preset is None else {"preset": preset, **extra}


def _with_preset(preset, strategies):
    """strategies= of preset=`preset` beside strategies=`strategies`: a name alone, or the dict with it."""
    if preset is None:
        return strategies
    had, extra = scheme_of(strategies)
    if had is not None and had != preset:
        raise ValueError(f"preset={preset!r} and strategies={{'preset': {had!r}}} name two presets: give one")
    return {"preset": preset, **extra} if extra else preset


def homes(names) -> set[str]:
    """The parameters the earlier-version `names` (of MOVED and FOLDED) live in now."""
    return {(MOVED.get(k) or FOLDED[k])[0] for k in names}


#: the residual structures whose neighbour count K is written "name:K"
WITH_K = ("vecchia", "auto")


def residual_k(value) -> tuple[str, int | None]:
    """(structure, K) of a ``residual=`` value: "vecchia:K" and "auto:K" carry the Vecchia residual's neighbour
    count K (None: the default, model/vecchia_order.py VECCHIA_K); any other value is a plain name."""
    name, colon, k = str(value).partition(":")
    if not colon:
        return str(value), None
    if name not in WITH_K:
        raise ValueError(f"{_residual(value)}: only vecchia:K and auto:K take a neighbour count K; give "
                         f"{_residual(name)} alone")
    try:
        K = int(k)
    except ValueError:
        K = 0
    if K < 1:
        raise ValueError(f"{_residual(value)}: K (neighbours per point of the Vecchia residual) must be an integer "
                         f"≥ 1, e.g. {_residual(name + ':30')}")
    return name, K


def _residual(value) -> str:
    """residual=VALUE in the caller's spelling (api or command line)."""
    return option(f"residual={str(value)!r}", f"--residual {value}")


def _with_k(k, residual):
    """residual= of vecchia_k=`k` beside residual=`residual`: K joins a structure that has one (vecchia, auto); the
    others never used it, as before."""
    name, had = residual_k(residual)
    if k is None or name not in WITH_K:
        return residual
    if had is not None and had != k:
        raise ValueError(f"{_residual(residual)} and {option('vecchia_k=', '--vecchia-k ')}{k} give two neighbour "
                         f"counts: give one, {_residual(name + ':K')}")
    return f"{name}:{k}"


def _every(every, checkpoint):
    """checkpoint= of checkpoint_every=`every` beside checkpoint=`checkpoint`."""
    if every is None:
        return checkpoint
    if checkpoint is None:
        raise ValueError("checkpoint_every needs the file to write: checkpoint=Checkpoint(path, every=K)")
    return replace(checkpoint_of(checkpoint), every=every)


def _secure(asked, noise):
    """privacy= of secure_aggregation=`asked` beside privacy=`noise`: one or the other."""
    if asked and noise not in (None, "secure_aggregation"):
        raise ValueError("secure aggregation (the statistics scheme) and privacy noise (the block scheme) cannot be "
                         "combined: choose one")
    return "secure_aggregation" if asked else noise


def spelled(flat: dict) -> dict:
    """Estimator keywords from flat settings (the command line's): the names of MOVED and FOLDED put where they
    live now, silently."""
    moved = {k: v for k, v in flat.items() if k in MOVED or k in FOLDED}
    rest = {k: v for k, v in flat.items() if k not in moved}
    base = {"cluster": None, "emulation": None, "progress": True, "strategies": None, "privacy": None,
            "residual": "auto", "checkpoint": None}
    settings = absorb_moved({**base, **rest}, moved, warn=False)
    touched = set(rest) | homes(moved)
    return {k: v for k, v in settings.items() if k in touched}


def absorb_moved(settings: dict, moved: dict, warn: bool = True) -> dict:
    """The constructor's `settings` with the parameters of earlier versions in `moved` put where they now live;
    each warns (FutureWarning) naming its new spelling. An unknown name is a TypeError, as for any estimator."""
    unknown = sorted(set(moved) - set(MOVED) - set(FOLDED))
    if unknown:
        raise TypeError(f"FederatedGP got unexpected keyword argument(s) {unknown}")
    settings = dict(settings)
    for name, value in moved.items():
        if name in FOLDED:
            into, fold, spelling = FOLDED[name]
            settings[into] = fold(value, settings[into])
            spelling = spelling(settings[into]) if callable(spelling) else spelling
        else:
            into, field = MOVED[name]
            spelling = f"{into}={_SPELLING[into]}({field}=...) (from spatialfed import {_SPELLING[into]})"
            if name == "runtime" and isinstance(value, str) and settings[into] is None:  # the runtime alone
                spelling = f"cluster={value!r}"
            made = (cluster_of if into == "cluster" else emulation_of)(settings[into])
            settings[into] = replace(made, **{field: value})
        if warn:
            warnings.warn(f"FederatedGP({name}=...) is now {spelling}; the old spelling goes in the next release",
                          FutureWarning, stacklevel=3)
    return settings
