"""Federated prediction from a fit directory: the low-rank part on the server, the residual part by the owner.

Modules: `model` (FittedModel from a fit directory or an estimator; the store and predictor checks), `engine` (the
sites as a runtime, the server combining their parts batch by batch), `targets` (the locations, their design
matrix and observed values), `files` (predict, predict_to_file and the files they write). Everything public is
importable from `spatialfed.outputs.prediction` itself.

For prediction locations s₀ (with covariates x₀) and a fitted low-rank model (SPEC §1; maths in
`spatialfed.model.predict`):

    mean = x₀ᵀγ + b(s₀)ᵀμ + E[w̃(s₀) | z_owner],   sd = √(Var[y(s₀) | z] + δ⁻¹)  (a new observation at s₀)

**Owner rule.** Every federated worker reports only its distance from each s₀ to its nearest observation; s₀ belongs to
the worker with the smallest distance (ties: the lowest index). With an `area` partition this is the worker whose area
holds s₀. The owner computes the residual part of s₀ from its own data (`LocalModel.residual_kriging`) and returns
arrays whose size is the number of its prediction points, never n_j: raw data never leave a worker.

Predictors (`PREDICTORS`):
- `seamless` (default for low-rank fits): the low-rank kriging above with the residual part blended over the sites
  whose data lie within a band of s₀ (smooth partition-of-unity weights, `outputs.seamless`): continuous across the
  owners' boundaries, the owner's prediction deep inside its region.
- `lowrank`: the federated low-rank kriging above, the residual from the owner alone (the owner predictor; residual
  pp: the low-rank part alone).
- `independent`: the independence model (Eq. 3): each s₀ kriged by its owner from its own data only, global (γ, δ, θ).
- `personal`: FGPR's personalised prediction: one chosen worker kriges every s₀ from its own data, global (γ, δ, θ).
- `ols`: pooled ordinary least squares from the workers' moments (XᵀX, Xᵀz, zᵀz): mean x₀ᵀγ̂ and the OLS
  prediction sd s·√(1 + x₀ᵀ(XᵀX)⁻¹x₀).

Runtimes: `dask` runs every worker's part in a task on the Dask worker that loads and keeps partition j (the fit's
partition executor, `runtime.site`); `simulated` loads the partitions in this process (small data, tests).

**Scale.** Locations are predicted in batches (`predict_batches`): every site call sees one batch, so a
worker builds at most batch × n_j cross-covariances and the server batch × m matrices — never an n₀ × n₀ or
n₀ × n_j one. `batch_size` picks the batch from the largest site (about 4·10⁶ entries per matrix, 32 MB). The
predict command streams each finished batch to a staged temporary file (`tables.stream_table`, renamed into place
at the end by `spatialfed.atomic`), with a tqdm bar and its ETA on stderr (`predict_to_file`); memory is the
targets (n₀ × (2 + p)) plus one batch.
"""

from spatialfed.outputs.bars import counting, progress_bar  # noqa: F401 (the bar of predict's progress)
from spatialfed.outputs.domains import default_domain, load_domain, outside_domain, resolve_domain  # noqa: F401
from spatialfed.outputs.prediction.engine import (BATCH_BUDGET, BATCH_RANGE, CHUNK, batch_size,  # noqa: F401
                                                  ols_prediction, open_workers, owners_of, place, predict_at,
                                                  predict_batches, prediction_runtime)
from spatialfed.outputs.prediction.files import (LOGNORMAL, METRICS_JSON, SCORED, predict,  # noqa: F401
                                                 predict_to_file, prediction_frame, refuse_metrics,
                                                 write_prediction)
from spatialfed.outputs.prediction.model import (PREDICTORS, FittedModel, check_predictor, check_store,  # noqa: F401
                                                 default_predictor, load_model)
from spatialfed.outputs.prediction.targets import (INTERCEPT, Targets, design_matrix, heldout_targets,  # noqa: F401
                                                   input_crs, observed_column, table_targets)
from spatialfed.runtime.factory import RUNTIMES  # noqa: F401 (the choices of predict's --runtime)
