"""Centralized references for tests and experiments: ℓ_LR via Woodbury, the exact GP, the independence model, KL.

These see all the data at once and exist to check the federated computations and to run the paper's
Proposition 4 experiment; the federated fit never calls them.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist

from spatialfed.model.blocks import LOG_2PI, _spd_inverse
from spatialfed.model.local import check_residual
from spatialfed.model.matern import Matern
from spatialfed.model.names import RESIDUALS
from spatialfed.model.residuals import residual_strategy
from spatialfed.model.vecchia_order import VECCHIA_K, VecchiaPlan, vecchia_plan

Part = tuple[np.ndarray, np.ndarray, np.ndarray]  # (locs, z, X) of one worker


def _cho(A: np.ndarray, what: str):
    try:
        return linalg.cho_factor(A, lower=True, check_finite=False)
    except linalg.LinAlgError:
        raise np.linalg.LinAlgError(f"{what} is not positive definite") from None


def _logdet(cf) -> float:
    return 2.0 * float(np.sum(np.log(np.diag(cf[0]))))


def vecchia_covariance(R: np.ndarray, plan: VecchiaPlan) -> np.ndarray:
    """U⁻¹DU⁻ᵀ, the covariance whose inverse is the Vecchia approximation UᵀD⁻¹U (U = I − A) of a dense R in the
    plan's ordering and conditioning sets (SPEC §2c): a_i = R_NN⁻¹R_N,i, D_i = R_ii − R_i,N a_i by dense solves of
the dense R (no whitened basis: independent of model/vecchia.py)."""
    valid = plan.nbrs >= 0
    N, i = np.where(valid, plan.nbrs, 0), plan.order
    both = valid[:, :, None] & valid[:, None, :]
    C = np.where(both, R[N[:, :, None], N[:, None, :]], np.eye(plan.k))  # missing neighbours: identity, a = 0
    rN = np.where(valid, R[N, i[:, None]], 0.0)
    a = np.linalg.solve(C, rN[:, :, None])[:, :, 0]
    U = np.eye(R.shape[0])
    np.add.at(U, (np.broadcast_to(i[:, None], N.shape), N), -a)
    D = np.empty(R.shape[0])
    D[i] = np.diag(R)[i] - np.sum(rN * a, axis=1)  # by point, as U's rows
    Ui = linalg.inv(U)  # unit triangular in the plan's order
    return (Ui * D) @ Ui.T


@functools.lru_cache(maxsize=32)
def _plan(points: bytes, dims: int, k: int) -> VecchiaPlan:
    """vecchia_plan of a (small) site's locations, kept: a reference evaluates ℓ at many u for the same sites."""
    return vecchia_plan(np.frombuffer(points).reshape(-1, dims), k)


def residual_covariance(locs, knots, kernel: Matern, sigma2, beta, delta, residual: str,
                        vecchia_k: int = VECCHIA_K) -> np.ndarray:
    """R_j(δ, θ) of Remark 3 as a dense matrix (small n only); `vecchia`: the Vecchia approximation of the full one
    in the site's plan (vecchia_plan(locs, vecchia_k), max-min ordering, as LocalModel and family_statistics)."""
    if check_residual(residual) not in RESIDUALS:
        raise ValueError(f"the dense reference has the residuals {RESIDUALS}; residual={residual!r} is not one")
    C_js = kernel.cross(locs, knots, sigma2, beta)
    K = kernel.cross(knots, knots, sigma2, beta)
    Q = C_js @ linalg.solve(K, C_js.T, assume_a="pos")
    rs = residual_strategy(residual)
    if rs.pointwise:
        R = kernel.cross(locs, locs, sigma2, beta) - Q + np.eye(len(locs)) / delta
        locs = np.ascontiguousarray(locs, dtype=float)
        return vecchia_covariance(R, _plan(locs.tobytes(), locs.shape[1], int(vecchia_k)))
    if rs.dense:
        W = kernel.cross(locs, locs, sigma2, beta) - Q
    elif rs.kriges:  # mpp
        W = np.diag(sigma2 - np.diag(Q))
    else:
        W = np.zeros_like(Q)
    return W + np.eye(len(locs)) / delta


def lowrank_loglik(parts: list[Part], knots, kernel: Matern, residual: str, gamma, delta, sigma2, beta) -> float:
    """ℓ_LR: log N(z; Xγ, BKBᵀ + blockdiag R_j) by Woodbury and the determinant lemma (no N×N matrix)."""
    K = kernel.cross(knots, knots, sigma2, beta)
    Kcf = _cho(K, "K")
    inner = K.copy()  # K + Σ_j C_sj R_j⁻¹ C_js
    rhs = np.zeros(K.shape[0])
    quad, logdet_R, n_obs = 0.0, 0.0, 0
    for locs, z, X in parts:
        Rcf = _cho(residual_covariance(locs, knots, kernel, sigma2, beta, delta, residual), "R_j")
        C_js = kernel.cross(locs, knots, sigma2, beta)
        e = z - X @ np.asarray(gamma)
        RiC = linalg.cho_solve(Rcf, C_js, check_finite=False)
        inner += C_js.T @ RiC
        rhs += RiC.T @ e
        quad += e @ linalg.cho_solve(Rcf, e, check_finite=False)
        logdet_R += _logdet(Rcf)
        n_obs += len(z)
    Icf = _cho(inner, "K + Cᵀ R⁻¹ C")
    quad -= rhs @ linalg.cho_solve(Icf, rhs, check_finite=False)
    logdet = logdet_R + _logdet(Icf) - _logdet(Kcf)
    return -0.5 * (n_obs * LOG_2PI + logdet + quad)


def lowrank_covariance(parts: list[Part], knots, kernel: Matern, residual: str, delta, sigma2, beta,
                       vecchia_k: int = VECCHIA_K) -> np.ndarray:
    """The dense N×N covariance BKBᵀ + blockdiag R_j of the low-rank model (small N only)."""
    locs = np.vstack([p[0] for p in parts])
    C_s = kernel.cross(locs, knots, sigma2, beta)
    cov = C_s @ linalg.solve(kernel.cross(knots, knots, sigma2, beta), C_s.T, assume_a="pos")
    start = 0
    for loc_j, _, _ in parts:
        sl = slice(start, start + len(loc_j))
        cov[sl, sl] += residual_covariance(loc_j, knots, kernel, sigma2, beta, delta, residual, vecchia_k)
        start += len(loc_j)
    return cov


def exact_loglik(locs, z, X, kernel: Matern, gamma, delta, sigma2, beta) -> float:
    """The exact GP log-likelihood ℓ of Eq. (2) (N×N: small N only)."""
    C = kernel.cross(locs, locs, sigma2, beta) + np.eye(len(z)) / delta
    cf = _cho(C, "C + δ⁻¹I")
    e = z - X @ np.asarray(gamma)
    return -0.5 * (len(z) * LOG_2PI + _logdet(cf) + e @ linalg.cho_solve(cf, e, check_finite=False))


def independent_loglik(parts: list[Part], kernel: Matern, gamma, delta, sigma2, beta) -> float:
    """ℓ_ind = Σ_j log N(z_j; X_jγ, C_jj + δ⁻¹I) (Eq. 3)."""
    return sum(exact_loglik(locs, z, X, kernel, gamma, delta, sigma2, beta) for locs, z, X in parts)


def independent_local_terms(locs, z, X, kernel: Matern, gamma, delta, sigma2, beta) -> dict:
    """−ℓ_j of Eq. (3) with its gradient and Hessian in u = (log δ, log σ², log β), and the GLS pieces for γ."""
    d = np.sqrt(((locs[:, None, :] - locs[None, :, :]) ** 2).sum(-1))
    rho, rho1, rho2 = kernel.correlation_derivatives(d, beta)
    n, eps = len(z), 1.0 / delta
    M = sigma2 * rho + eps * np.eye(n)
    cf = _cho(M, "C_jj + δ⁻¹I")
    G = linalg.cho_solve(cf, np.eye(n), check_finite=False)
    e = z - X @ np.asarray(gamma)
    alpha = G @ e
    # M_δ = −εI, M_s = σ²ρ, M_b = σ²ρ̇; M_δδ = εI, M_ss = M_s, M_sb = M_b, M_bb = σ²ρ̈
    Ma = [-eps * np.eye(n), sigma2 * rho, sigma2 * rho1]
    Mab = {(0, 0): eps * np.eye(n), (1, 1): Ma[1], (1, 2): Ma[2], (2, 2): sigma2 * rho2}
    GMa = [G @ Mi for Mi in Ma]
    grad = np.array([0.5 * np.trace(GMa[a]) - 0.5 * alpha @ Ma[a] @ alpha for a in range(3)])
    hess = np.zeros((3, 3))
    for a in range(3):
        for b in range(a, 3):
            Mab_ = Mab.get((a, b))
            val = -0.5 * np.einsum("ij,ji->", GMa[a], GMa[b]) + alpha @ Ma[a] @ GMa[b] @ alpha
            if Mab_ is not None:
                val += 0.5 * np.einsum("ij,ji->", G, Mab_) - 0.5 * alpha @ Mab_ @ alpha
            hess[a, b] = hess[b, a] = val
    return {
        "f": 0.5 * (n * LOG_2PI + _logdet(cf) + e @ alpha),
        "grad": grad,
        "hess": hess,
        "XtGX": X.T @ G @ X,
        "XtGz": X.T @ G @ z,
    }


def _kl_normalised(C: np.ndarray, Cq: np.ndarray) -> float:
    """KL_N(N(0,C) ‖ N(0,Cq)) = [tr(Cq⁻¹C) − N + log det Cq − log det C] / (2N) (Remark 5)."""
    n = C.shape[0]
    cq, cp = _cho(Cq, "the approximating covariance"), _cho(C, "the GP covariance")
    tr = np.trace(linalg.cho_solve(cq, C, check_finite=False))
    return 0.5 * (tr - n + _logdet(cq) - _logdet(cp)) / n


def _latent_covariances(loc_parts, kernel, sigma2, beta, nugget):
    locs = np.vstack(loc_parts)
    C = kernel.cross(locs, locs, sigma2, beta) + nugget * np.eye(len(locs))
    blocks = []
    start = 0
    for lp in loc_parts:
        blocks.append(slice(start, start + len(lp)))
        start += len(lp)
    return locs, C, blocks


def kl_lowrank(loc_parts, knots, kernel: Matern, sigma2, beta, nugget: float = 0.0) -> float:
    """KL_N(P ‖ P₁): the GP against the low-rank model with full local covariance (Proposition 4).

    P₁ keeps C_jj within each worker and uses C(S_i,S*)K⁻¹C(S*,S_j) across workers. `nugget` adds the
    same δ⁻¹I to both (the paper's latent case is nugget = 0; a small nugget keeps large N well conditioned).
    """
    locs, C, blocks = _latent_covariances(loc_parts, kernel, sigma2, beta, nugget)
    C_s = kernel.cross(locs, knots, sigma2, beta)
    C1 = C_s @ _spd_inverse(kernel.cross(knots, knots, sigma2, beta), "K") @ C_s.T
    for sl in blocks:
        C1[sl, sl] = C[sl, sl]
    return _kl_normalised(C, C1)


def kl_independent(loc_parts, kernel: Matern, sigma2, beta, nugget: float = 0.0) -> float:
    """KL_N(P ‖ P₂): the GP against the independence model blockdiag(C_jj) (Proposition 4)."""
    _, C, blocks = _latent_covariances(loc_parts, kernel, sigma2, beta, nugget)
    C2 = np.zeros_like(C)
    for sl in blocks:
        C2[sl, sl] = C[sl, sl]
    return _kl_normalised(C, C2)


def lowrank_kriging(parts: list[Part], owners, locs0, X0, knots, kernel: Matern, residual: str, gamma, delta, sigma2, beta):
    """Centralized kriging under the low-rank model's joint covariance (N×N: small N only).

    s₀ shares its residual w̃ with worker owners[i]; returns the mean and latent variance of y(s₀).
    """
    if residual_strategy(residual).pointwise:
        raise ValueError("the dense kriging reference has the full, mpp and pp residuals, not residual='vecchia'")
    cov = lowrank_covariance(parts, knots, kernel, residual, delta, sigma2, beta)
    z = np.concatenate([p[1] for p in parts])
    X = np.vstack([p[2] for p in parts])
    K = kernel.cross(knots, knots, sigma2, beta)
    C0s = kernel.cross(locs0, knots, sigma2, beta)
    cross = C0s @ linalg.solve(K, np.vstack([kernel.cross(p[0], knots, sigma2, beta) for p in parts]).T, assume_a="pos")
    prior = np.einsum("ij,ji->i", C0s, linalg.solve(K, C0s.T, assume_a="pos"))
    start = 0
    for j, (loc_j, _, _) in enumerate(parts):
        rows, cols = np.flatnonzero(np.asarray(owners) == j), np.arange(start, start + len(loc_j))
        start += len(loc_j)
        if not residual_strategy(residual).kriges or rows.size == 0:
            continue
        full = kernel.cross(locs0[rows], loc_j, sigma2, beta)
        if residual_strategy(residual).diagonal:  # mpp: the residual is white: only coincident points share it
            full = np.where(cdist(locs0[rows], loc_j) == 0.0, full, cross[np.ix_(rows, cols)])
        cross[np.ix_(rows, cols)] = full
    if residual_strategy(residual).kriges:
        prior = np.full(len(locs0), float(sigma2))
    cf = _cho(cov, "the low-rank covariance")
    mean = X0 @ np.asarray(gamma) + cross @ linalg.cho_solve(cf, z - X @ np.asarray(gamma), check_finite=False)
    var = prior - np.einsum("ij,ji->i", cross, linalg.cho_solve(cf, cross.T, check_finite=False))
    return mean, var


def profile_lowrank_loglik(parts: list[Part], knots, kernel, residual: str, u,
                           vecchia_k: int = VECCHIA_K) -> tuple[float, np.ndarray]:
    """(max_γ ℓ_LR, γ̂) at u = (log δ, log σ², log β or a MaternFamily's κ) from the dense N×N covariance (GLS γ̂);
    `vecchia`: of the Vecchia-approximated residuals (vecchia_k neighbours)."""
    u = np.asarray(u, dtype=float)
    delta, sigma2 = float(np.exp(u[0])), float(np.exp(u[1]))
    theta = u[2:] if u.size > 3 or not isinstance(kernel, Matern) else float(np.exp(u[2]))
    cf = _cho(lowrank_covariance(parts, knots, kernel, residual, delta, sigma2, theta, vecchia_k),
              "the low-rank covariance")
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    CiX = linalg.cho_solve(cf, X, check_finite=False)
    gamma = linalg.solve(X.T @ CiX, CiX.T @ z, assume_a="pos")
    e = z - X @ gamma
    return -0.5 * (len(z) * LOG_2PI + _logdet(cf) + e @ linalg.cho_solve(cf, e, check_finite=False)), gamma
