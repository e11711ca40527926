"""Worker-side low-rank model: worker j's partition (S_j, z_j, X_j) with the shared knots, answering the local
quantities L_j(p) of Eq. (13) (SPEC §3) and the prediction requests.

B = ρ_js ρ_K⁻¹ (model/basis.py); the residual part of R_j is W = σ² W̃(β) and R = W + εI with ε = 1/δ, dense for
`full` and diagonal for `mpp`/`pp` (model/dense.py). The block scheme's theta step is model/theta.py, the
statistics of SPEC §2b model/stats.py, the kriging pieces model/kriging.py; this class holds the data and the caches.

Memory: between requests a worker keeps only its data, the knots and, for the latest (δ, θ), the whitened
L⁻¹[B, X, z] with log det R (O(n_j(m + p)) numbers); no n_j × n_j matrix and no knot basis outlive a request,
except one factorisation kept for prediction (`residual_kriging`). A theta step of the full residual holds at most
three n_j × n_j arrays at once (R⁻¹, σ²∂W̃/∂log β and their product), an R_j factorisation one. The price: the theta
step of the full residual factorises R_j again (≈ 10 % of its time) instead of reusing the mu_sigma step's factor.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from spatialfed.errors import check_finite
from spatialfed.model import dense, kriging, vecchia
from spatialfed.model import theta as theta_step
from spatialfed.model.basis import KnotBasis, check_knots
from spatialfed.model.family import MaternFamily
from spatialfed.model.linalg import DenseFactor, DiagFactor, inner
from spatialfed.model.matern import Matern, check_points, norm
from spatialfed.model.names import BLOCK_STEPS
from spatialfed.model.params import Params
from spatialfed.model.residuals import ResidualStrategy, check_residual, resolve_residual, residual_strategy  # noqa: F401
from spatialfed.model.variogram import binned_semivariogram
from spatialfed.model.vecchia_order import (PREDICT_FACTOR, VECCHIA_AUTO_N, VECCHIA_K, VecchiaPlan, check_k,
                                           check_ordering, vecchia_plan)

STEPS = BLOCK_STEPS


class _Whitened:
    """What the mu_sigma, gamma and value sub-steps at one (δ, θ) need, kept between requests: log det R_j and
    L⁻¹[B, X, z] (n_j × (m + p + 1))."""

    __slots__ = ("key", "logdet", "Bh", "Xh", "zh")

    def __init__(self, key, logdet: float, Bh: np.ndarray, Xh: np.ndarray, zh: np.ndarray):
        self.key, self.logdet, self.Bh, self.Xh, self.zh = key, logdet, Bh, Xh, zh


class _Factorised:
    """R_j(δ, θ) factorised, with its knot basis and whitened data: built for one request and dropped after it
    (or kept for prediction)."""

    def __init__(self, model: "LocalModel", delta: float, sigma2: float, beta: float, whiten: bool = True):
        self.key = (delta, sigma2, beta)
        self.eps = 1.0 / delta
        self.sigma2 = sigma2
        self.anchor_weights = None  # R⁻¹k̃(S, U) of a Vecchia site's exchange points (its anchor model; first use)
        if model.strategy.pointwise:  # no factor: the whitened data come point by point (model/vecchia.py)
            self.kb = self.factor = None
            kf = vecchia.KnotFactors(model.kernel, model.d_K, model.locs, model.knots, beta, derivatives=False)
            self.logdet, W = vecchia.whitened(model.X, model.z, model.vecchia_plan, kf, sigma2, self.eps)
            m, p = model.m, model.p
            self.Bh, self.Xh, self.zh = W[:, :m], W[:, m : m + p], W[:, -1]
            return
        self.kb = model._basis(beta)
        what = f"R_j of worker data (n={model.n})"
        if model.strategy.dense:
            self.factor = DenseFactor(dense.dense_residual(model, self.kb, sigma2, self.eps), what)  # in place
        else:
            self.factor = DiagFactor(sigma2 * dense.residual_unit(model, self.kb) + self.eps, what)
        self.logdet = self.factor.logdet()
        self.Bh = self.Xh = self.zh = None
        if not whiten:
            return
        # one triangular solve serves the mu_sigma, gamma and value sub-steps: L⁻¹[B, X, z]
        W = self.factor.whiten(np.hstack([self.kb.B, model.X, model.z[:, None]]))
        m, p = self.kb.B.shape[1], model.X.shape[1]
        self.Bh, self.Xh, self.zh = W[:, :m], W[:, m : m + p], W[:, -1]

    def whitened(self) -> _Whitened:
        return _Whitened(self.key, self.logdet, self.Bh, self.Xh, self.zh)


class LocalModel:
    """Worker j's partition (S_j, z_j, X_j) with the shared knots: computes L_j(p) (Eq. 13, SPEC §3)."""

    def __init__(self, locs, z, X, knots, kernel: Matern, residual: str = "full", vecchia_k: int = VECCHIA_K,
                 vecchia_ordering: str = "maxmin"):
        self.locs = check_points(locs, "locs")
        self.z = check_finite(np.asarray(z, dtype=float).reshape(-1), "z")
        X = np.asarray(X, dtype=float)
        if X.ndim == 1:
            X = X[:, None]
        self.X = check_finite(X, "X")
        n = self.locs.shape[0]
        if n == 0:
            raise ValueError("this worker's partition is empty: every worker needs at least one observation")
        if self.z.shape[0] != n or self.X.shape[0] != n:
            raise ValueError(
                f"locs, z and X must have the same number of rows, got {n}, {self.z.shape[0]}, {self.X.shape[0]}"
            )
        self.knots = check_knots(knots)
        if not isinstance(kernel, (Matern, MaternFamily)):  # a family: its statistics only (model/family_stats.py)
            raise TypeError(f"kernel must be a spatialfed Matern or MaternFamily, got {type(kernel).__name__}")
        self.kernel = kernel
        self.residual = resolve_residual(residual, n)
        self.vecchia_k = check_k(vecchia_k)  # neighbours per point of the Vecchia residual (SPEC §2c)
        self.vecchia_ordering = check_ordering(vecchia_ordering)
        self._plan: VecchiaPlan | None = None  # the Vecchia ordering and neighbours, O(n_j k), built on first use
        self.d_K = cdist(self.knots, self.knots)
        self._white: _Whitened | None = None  # the latest (δ, θ)'s whitened data: what the fit keeps between requests
        self._kriging: _Factorised | None = None  # one factorisation, kept for prediction requests only
        self._tree: cKDTree | None = None  # k-d tree of locs (owner assignment), O(n_j), built on first use
        self._pilot: LocalModel | None = None  # the pilot start's subsample of this site (`pilot`), built on first use
        self._anchored: tuple | None = None  # Vecchia: (the exchange points' bytes, their neighbourhood's model)

    @property
    def vecchia_plan(self) -> VecchiaPlan:
        """The Vecchia ordering and conditioning sets of this site (locations only: built once, kept)."""
        if self._plan is None:
            self._plan = vecchia_plan(self.locs, self.vecchia_k, self.vecchia_ordering)
        return self._plan

    @property
    def n(self) -> int:
        """n_j, the number of observations held by this worker."""
        return self.locs.shape[0]

    @property
    def p(self) -> int:
        """Number of covariates (columns of X_j)."""
        return self.X.shape[1]

    @property
    def m(self) -> int:
        """Number of knots."""
        return self.knots.shape[0]

    def clear_cache(self) -> None:
        """Drop what is kept between requests (the whitened data and the prediction factorisation)."""
        self._white = None
        self._kriging = None
        self._anchored = None

    def cached_arrays(self) -> list[np.ndarray]:
        """The arrays this model keeps between requests beyond its data (for memory checks and diagnostics)."""
        out = []
        if self._white is not None:
            out += [self._white.Bh, self._white.Xh, self._white.zh]
        if self._plan is not None:
            out += [self._plan.order, self._plan.nbrs]
        if self._kriging is not None:
            fz = self._kriging
            out += [a for a in (getattr(fz.factor, "L", None), getattr(fz.factor, "r", None), fz.Bh, fz.Xh, fz.zh)
                    if a is not None]
            out += [v for v in vars(fz.kb).values() if isinstance(v, np.ndarray)]
            out += [] if fz.anchor_weights is None else [fz.anchor_weights]
        if self._anchored is not None:
            out += self._anchored[1].cached_arrays()
        return out

    def cached_nbytes(self) -> int:
        """Bytes of `cached_arrays` (views of one buffer counted once per view)."""
        return int(sum(a.nbytes for a in self.cached_arrays()))

    def _basis(self, beta: float) -> KnotBasis:
        return KnotBasis(self.kernel, self.d_K, self.locs, self.knots, beta)

    def factorise(self, params: Params, whiten: bool = True) -> _Factorised:
        """A fresh factorisation of R_j at params' (δ, θ); with `whiten`, its whitened data become the kept
        `_white` (the statistics route needs no whitened data: whiten=False)."""
        fz = _Factorised(self, *params.theta_key, whiten=whiten)
        if whiten:
            self._white = fz.whitened()
        if self._kriging is not None and self._kriging.key != fz.key:
            self._kriging = None
        return fz

    def _whitened(self, params: Params) -> _Whitened:
        """The kept whitened data at params' (δ, θ), factorising R_j (then dropping the factor) on a miss."""
        if self._white is None or self._white.key != params.theta_key:
            self.factorise(params)
        return self._white

    def _check_params(self, params: Params) -> None:
        if params.mu.shape[0] != self.m or params.gamma.shape[0] != self.p:
            raise ValueError(
                f"params have {params.mu.shape[0]} knots and {params.gamma.shape[0]} covariates, but this worker "
                f"has {self.m} knots and {self.p} covariates"
            )


    # --- initialisation summaries -------------------------------------------------------------------
    def moments(self) -> dict:
        """X_jᵀX_j, X_jᵀz_j, z_jᵀz_j, n_j (the pooled OLS start of SPEC §4) and the diameter of S_j's bounding box."""
        extent = float(norm(self.locs.max(axis=0) - self.locs.min(axis=0)))
        return {"XtX": self.X.T @ self.X, "Xtz": self.X.T @ self.z, "ztz": float(self.z @ self.z), "n": self.n,
                "extent": extent}

    #: at most this many of the worker's points enter the semivariogram (a seeded random subsample above it), so the
    #: pass costs O(n_j) for the residuals plus O(VARIOGRAM_MAX_POINTS²) for the pairs, whatever n_j is
    VARIOGRAM_MAX_POINTS = 2000
    VARIOGRAM_SEED = 0

    def variogram(self, gamma, edges, max_points: int | None = VARIOGRAM_MAX_POINTS,
                  seed: int = VARIOGRAM_SEED) -> dict:
        """Binned Σ ½(e_i − e_k)² and pair counts of OLS residuals e = z − Xγ over pairs within this worker
        (start.py step 2), bins [edges[k], edges[k+1]).

        Pairs come from all n_j points when n_j ≤ `max_points` (every pair, the O(n_j²) estimator), otherwise from a
        uniform random subsample of `max_points` points drawn with `seed` (deterministic): each pair of the worker is
        then kept with the same probability, so every bin's mean ½(e_i − e_k)² is still unbiased for the
        semivariogram, from at most max_points·(max_points − 1)/2 pairs. `max_points=None` uses every point.
        Only the binned sums and counts leave the worker.
        """
        edges = np.asarray(edges, dtype=float)
        idx = self.variogram_subsample(self.n, max_points, seed)
        locs, z, X = (self.locs, self.z, self.X) if idx is None else (self.locs[idx], self.z[idx], self.X[idx])
        e = z - X @ np.asarray(gamma, dtype=float)
        sum_sq, count = binned_semivariogram(locs, e, edges)
        return {"sum_sq": sum_sq, "count": count}

    @staticmethod
    def variogram_subsample(n: int, max_points: int | None, seed: int) -> np.ndarray | None:
        """Sorted indices of a seeded uniform subsample of `max_points` of n rows, or None to keep all n."""
        if max_points is None or n <= max_points:
            return None
        if max_points < 2:
            raise ValueError(f"max_points={max_points}: the variogram subsample needs at least 2 points (one pair)")
        return np.sort(np.random.default_rng(seed).choice(n, size=int(max_points), replace=False))

    @property
    def strategy(self) -> ResidualStrategy:
        """This site's residual structure as a strategy (model/residuals.py)."""
        return residual_strategy(self.residual)

    def pilot(self, points: int) -> "LocalModel":
        """This site's model on a seeded uniform subsample of `points` observations (itself when n_j ≤ points) for
        the pilot start (algorithm/pilot.py); kept. Same knots and kernel; mpp/pp stay, a full or Vecchia residual is
        `auto` on the subsample (its exact full residual up to VECCHIA_AUTO_N points)."""
        if self.n <= points:
            return self
        if self._pilot is None or self._pilot.n != points:
            idx = self.variogram_subsample(self.n, int(points), self.VARIOGRAM_SEED)
            residual = self.residual if self.strategy.diagonal else "auto"
            self._pilot = LocalModel(self.locs[idx], self.z[idx], self.X[idx], self.knots, self.kernel, residual,
                                     self.vecchia_k, self.vecchia_ordering)
        return self._pilot

    # --- local quantities L_j(p), Eq. (13) ---------------------------------------------------------
    def quantity(self, step: str, params: Params) -> dict:
        """L_j(p) for the sub-step named in p (SPEC §3), plus "value" (f_j alone) for the final pass."""
        self._check_params(params)
        if step == "mu_sigma":
            return self.mu_sigma(params)
        if step == "gamma":
            return self.gamma_step(params)
        if step == "theta":
            return self.theta(params)
        if step == "value":
            return {"f": self.value(params)}
        raise ValueError(f"unknown sub-step {step!r}; expected one of {STEPS + ('value',)}")

    def mu_sigma(self, params: Params) -> dict:
        """A_j = B_jᵀR_j⁻¹B_j and b_j = B_jᵀR_j⁻¹(z_j − X_jγ) for Eq. (8), and W_j = B_jᵀR_j⁻¹X_j (m × p).

        W_j lets the server take the exact joint (μ, γ) step given θ (docs/algorithm.md): with an intercept in X,
        the intercept and Bμ both carry the mean and alternating μ- and γ-updates crawl.
        """
        wh = self._whitened(params)
        r0h = wh.zh - wh.Xh @ params.gamma
        return {"A": wh.Bh.T @ wh.Bh, "b": wh.Bh.T @ r0h, "BtRX": wh.Bh.T @ wh.Xh}

    def gamma_step(self, params: Params) -> dict:
        """X_jᵀR_j⁻¹X_j and X_jᵀR_j⁻¹(z_j − B_jμ) for Eq. (9)."""
        wh = self._whitened(params)
        return {"XtRX": wh.Xh.T @ wh.Xh, "XtRr": wh.Xh.T @ (wh.zh - wh.Bh @ params.mu)}

    def value(self, params: Params) -> float:
        """f_j = ½ log det R_j + ½ rᵀR_j⁻¹r + ½ tr(B_jᵀR_j⁻¹B_jΣ) (SPEC §1)."""
        wh = self._whitened(params)
        rh = wh.zh - wh.Xh @ params.gamma - wh.Bh @ params.mu
        return 0.5 * (wh.logdet + rh @ rh + inner(wh.Bh.T @ wh.Bh, params.Sigma))

    def theta(self, params: Params) -> dict:
        """f_j, ∂f_j/∂u, ∂²f_j/∂u² (Eq. 10 and 13) and G_j = (∂²f_j/∂u∂μ, ∂²f_j/∂u∂Σ) (Eq. 16): model/theta.py."""
        if not self.strategy.block_scheme:
            raise ValueError("residual='vecchia' answers the statistics scheme (preset 'stats', the default) and the "
                             "mu_sigma/gamma/value sub-steps, not the block scheme's theta step: use strategies='stats' "
                             "or residual='full'")
        return theta_step.theta(self, self.factorise(params), params)

    # --- prediction (federated kriging): the residual part, computed where the data live -------------
    def nearest_distance(self, locs0) -> np.ndarray:
        """Distance from each prediction location to this worker's nearest observation (owner assignment): a k-d
        tree query, O(n₀ log n_j) time and O(n₀) memory (a dense n₀ × n_j distance matrix cost 40× more)."""
        return self._neighbours().query(check_points(locs0, "prediction locations", self.locs.shape[1]), k=1)[0]

    def _kriging_factor(self, params: Params) -> _Factorised:
        """The one factorisation a worker keeps: R_j at params' (δ, θ), reused by every prediction batch."""
        if self._kriging is None or self._kriging.key != params.theta_key:
            self._kriging = None  # free the old factor before building the new one
            self._kriging = _Factorised(self, *params.theta_key)
        return self._kriging

    def residual_kriging(self, locs0, params: Params, anchors=None) -> dict:
        """E[w̃(s₀) | η = μ, z_j], and the pieces of Var(y(s₀) | z) owed to this worker's residual.

        With k̃ = cov(w̃(s₀), w̃_j): mean = k̃R_j⁻¹(z_j − X_jγ − B_jμ), BRk = (B_jᵀR_j⁻¹k̃ᵀ)ᵀ and
        kRk = diag(k̃R_j⁻¹k̃ᵀ); sizes grow with the number of prediction points, never with n_j. The Vecchia residual
        conditions each location on its PREDICT_FACTOR·k nearest points of the site instead (model/vecchia.py:
        kriging). With exchange points `anchors` (U) also "cross": cov(w̃(s₀), w̃(U) | z_j), n₀ × |U|
        (`anchor_posterior`).
        """
        self._check_params(params)
        locs0 = check_points(locs0, "prediction locations", self.locs.shape[1])
        if self.strategy.pointwise:  # the residual conditioned on the k nearest points of the site
            out = vecchia.kriging(self, locs0, params, PREDICT_FACTOR * self.vecchia_k, self._neighbours())
            if anchors is not None:  # through R⁻¹k̃(N, U), kept: O(n₀ |N| (m + |U|)) per request
                sub, anchors = self._anchor_model(anchors)
                fz = sub._kriging_factor(params)
                if fz.anchor_weights is None:
                    fz.anchor_weights = kriging.anchor_weights(sub, fz, anchors, params)
                out["cross"] = kriging.anchor_cross(sub, fz, locs0, anchors, params, fz.anchor_weights)
            return out
        if anchors is not None:
            anchors = self._anchor_model(anchors)[1]
        return kriging.residual_kriging(self, self._kriging_factor(params), locs0, params, anchors)

    def anchor_posterior(self, anchors, params: Params) -> dict:
        """This site's posterior of its residual at the exchange points U of the seamless predictor (η = μ): mean,
        BRk and covariance (model/kriging.py: anchor_posterior; outputs/exchange.py). A Vecchia site conditions on
        the PREDICT_FACTOR·k nearest points of each exchange point, together (a dense residual on their union)."""
        self._check_params(params)
        sub, anchors = self._anchor_model(anchors)
        return kriging.anchor_posterior(sub, sub._kriging_factor(params), anchors, params)

    def _neighbours(self) -> cKDTree:
        if self._tree is None:
            self._tree = cKDTree(self.locs)
        return self._tree

    def _anchor_model(self, anchors) -> tuple["LocalModel", np.ndarray]:
        """(the model the exchange points are conditioned on, the checked points): this site for the dense
        residual; for Vecchia the dense residual on the union of their nearest neighbours (kept for the batches)."""
        anchors = check_points(anchors, "exchange points", self.locs.shape[1])
        if self.strategy.dense:
            return self, anchors
        if not self.strategy.pointwise:
            raise ValueError(f"the boundary exchange needs a correlated residual (full or vecchia), not "
                             f"{self.residual!r}")
        key = anchors.tobytes()
        if self._anchored is None or self._anchored[0] != key:
            k = min(PREDICT_FACTOR * self.vecchia_k, self.n)
            idx = np.unique(self._neighbours().query(anchors, k=k)[1])
            self._anchored = None
            sub = LocalModel(self.locs[idx], self.z[idx], self.X[idx], self.knots, self.kernel, residual="full")
            self._anchored = (key, sub)
        return self._anchored[1], anchors

    def independent_kriging(self, locs0, X0, params: Params) -> dict:
        """Kriging from this worker's data alone under the independence model (Eq. 3) with global (γ, δ, θ):
        FGPR's personalised prediction (model/kriging.py)."""
        return kriging.independent_kriging(self, locs0, X0, params)
