"""Server-side block updates of Section 3.1 (SPEC §2): closed-form μ, Σ, γ and the Newton step on u.

The server never sees data: it combines the aggregated worker quantities of SPEC §3 with the common
term h(μ, Σ, θ) of Eq. (5), which depends only on the knots.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist

from spatialfed.errors import check_finite
from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.basis import check_knots
from spatialfed.model.matern import Matern

LOG_2PI = float(np.log(2.0 * np.pi))


def _spd_inverse(A: np.ndarray, what: str) -> np.ndarray:
    """Inverse of a symmetric positive definite matrix, symmetrised."""
    try:
        L = linalg.cholesky(A, lower=True, check_finite=False)
    except linalg.LinAlgError:
        raise np.linalg.LinAlgError(f"{what} is not positive definite; the aggregated quantities are inconsistent") from None
    inv = linalg.cho_solve((L, True), np.eye(A.shape[0]), check_finite=False)
    return 0.5 * (inv + inv.T)


class KnotCovariance:
    """K = σ²ρ_K(β) on the knots with its log-scale derivatives K_a = ∂K/∂u_a, K_ab (u = log δ, log σ², log β)."""

    def __init__(self, knots, kernel: Matern, sigma2: float, beta: float):
        knots = check_knots(knots)
        rK, rK1, rK2 = kernel.correlation_derivatives(cdist(knots, knots), beta)
        LK, tau = cholesky_with_jitter(rK, "the knot correlation matrix K")
        rK = rK + tau * np.eye(rK.shape[0]) if tau else rK
        self.K = sigma2 * rK
        self.logdet = float(np.log(sigma2) * rK.shape[0] + 2.0 * np.sum(np.log(np.diag(LK))))
        self.Kinv = _spd_inverse(self.K, "K")
        zero = np.zeros_like(rK)
        self.d1 = [zero, self.K, sigma2 * rK1]
        self.d2 = [[zero, zero, zero], [zero, self.K, sigma2 * rK1], [zero, sigma2 * rK1, sigma2 * rK2]]

    def inverse_derivatives(self) -> tuple[list, list, np.ndarray, np.ndarray]:
        """(∂_aK⁻¹, ∂_abK⁻¹, ∂_a log det K, ∂_ab log det K) in u: K⁻¹ = ρ⁻¹/σ² and log det K = m log σ² + log det ρ,
        so with L_β = K⁻¹K_β only β's terms need products: ∂_βK⁻¹ = −L_βK⁻¹, ∂_ββK⁻¹ = 2L_βL_βK⁻¹ − K⁻¹K_ββK⁻¹,
        ∂_ββ log det K = tr(K⁻¹K_ββ) − tr(L_βL_β); ∂_σK⁻¹ = −K⁻¹, ∂_σσK⁻¹ = K⁻¹, ∂_σβK⁻¹ = L_βK⁻¹; δ's are 0."""
        Ki, zero = self.Kinv, np.zeros_like(self.Kinv)
        L1, L2 = Ki @ self.d1[2], Ki @ self.d2[2][2]
        L1Ki = L1 @ Ki
        Y = L1 @ L1Ki
        dKi = [zero, -Ki, -L1Ki]
        d2Ki = [[zero, zero, zero], [zero, Ki, L1Ki], [zero, L1Ki, Y + Y.T - L2 @ Ki]]
        dlogdet = np.array([0.0, float(Ki.shape[0]), float(np.trace(L1))])
        d2logdet = np.zeros((3, 3))
        d2logdet[2, 2] = float(np.trace(L2) - np.sum(L1 * L1.T))
        return dKi, d2Ki, dlogdet, d2logdet


def knot_covariance(knots, kernel: Matern, sigma2: float, beta: float) -> np.ndarray:
    """K = C_θ(S*, S*) (Eq. 4), with the jitter policy of docs/equations.md for near-singular K."""
    return KnotCovariance(knots, kernel, sigma2, beta).K


def update_mu_sigma(A_sum, b_sum, K) -> tuple[np.ndarray, np.ndarray]:
    """Σ⁺ = (Σ_j A_j + K⁻¹)⁻¹, μ⁺ = Σ⁺ Σ_j b_j (Eq. 8 with sums, SPEC §2)."""
    A_sum = check_finite(A_sum, "aggregated A")
    Sigma = _spd_inverse(0.5 * (A_sum + A_sum.T) + _spd_inverse(K, "K"), "Σ_j A_j + K⁻¹")
    return Sigma @ check_finite(b_sum, "aggregated b"), Sigma


def update_gamma(XtRX_sum, XtRr_sum) -> np.ndarray:
    """γ⁺ = (Σ_j X_jᵀR_j⁻¹X_j)⁻¹ Σ_j X_jᵀR_j⁻¹(z_j − B_jμ) (Eq. 9 with sums)."""
    M = check_finite(XtRX_sum, "aggregated XᵀR⁻¹X")
    try:
        return linalg.solve(0.5 * (M + M.T), check_finite(XtRr_sum, "aggregated XᵀR⁻¹r"), assume_a="pos")
    except linalg.LinAlgError:
        raise np.linalg.LinAlgError(
            "XᵀR⁻¹X is singular: the covariates are collinear (e.g. two intercept columns); drop the redundant ones"
        ) from None


def h_terms(mu, Sigma, knots, kernel: Matern, sigma2: float, beta: float) -> dict:
    """h = ½[μᵀK⁻¹μ + tr(K⁻¹Σ) − log det Σ + log det K − m] (Eq. 5) with its u-derivatives and G-terms."""
    kc = KnotCovariance(knots, kernel, sigma2, beta)
    Ki, m = kc.Kinv, kc.K.shape[0]
    S = Sigma + np.outer(mu, mu)
    _, logdet_sigma = np.linalg.slogdet(Sigma)
    f = 0.5 * (inner2(Ki, S) - logdet_sigma + kc.logdet - m)
    Dinv, D2, dlogdet, d2logdet = kc.inverse_derivatives()
    grad = 0.5 * (np.array([inner2(D, S) for D in Dinv]) + dlogdet)
    hess = np.zeros((3, 3))
    for a in range(3):
        for b in range(a, 3):
            hess[a, b] = hess[b, a] = 0.5 * (inner2(D2[a][b], S) + d2logdet[a, b])
    return {
        "f": float(f),
        "grad": grad,
        "hess": hess,
        "d2_du_dmu": np.stack([D @ mu for D in Dinv]),
        "d2_du_dSigma": 0.5 * np.stack(Dinv),
    }


def inner2(A: np.ndarray, B: np.ndarray) -> float:
    """⟨A, B⟩ = tr(AᵀB) for two dense matrices."""
    return float(np.einsum("ij,ij->", A, B))


def profile_hessian(hess, d2_du_dmu, d2_du_dSigma, Sigma) -> np.ndarray:
    """H_prof = H − VΣVᵀ − ½[tr(M_aΣM_bΣ)]_{ab}, M_a = 2∂²f/∂u_a∂Σ: the Hessian of −ℓ_LR in u (SPEC §2)."""
    V = np.asarray(d2_du_dmu)
    MS = [2.0 * Ma @ Sigma for Ma in np.asarray(d2_du_dSigma)]
    schur = np.array([[0.5 * inner2(MS[a], MS[b].T) for b in range(3)] for a in range(3)])
    H = np.asarray(hess) - V @ Sigma @ V.T - schur
    return 0.5 * (H + H.T)


def modified_hessian(H, floor: float = 1e-8) -> np.ndarray:
    """mod(H) of Eq. (10): eigenvalues replaced by their absolute values, raised to floor·max|λ|."""
    H = np.asarray(H, dtype=float)
    if not np.all(np.isfinite(H)):  # not missing data: an overflow upstream
        raise ValueError(f"the log-likelihood's Hessian has {int(np.size(H) - np.isfinite(H).sum())} non-finite "
                         "entries (an overflow: data values near the float64 limit, or privacy noise far above the "
                         "data's scale); check the data for absurd values, or lower the privacy noise multiplier")
    lam, Q = np.linalg.eigh(0.5 * (H + H.T))
    lam = np.abs(lam)
    lam = np.maximum(lam, floor * max(float(lam.max()), 1e-300))
    return (Q * lam) @ Q.T


def newton_step(u, grad, H, alpha: float = 1.0, bound: float = 1.0, floor: float = 1e-8) -> np.ndarray:
    """u⁺ = u − α·mod(H)⁻¹g (Eq. 10), scaled so that max|u⁺ − u| ≤ bound (SPEC §2 step bound)."""
    step = -alpha * np.linalg.solve(modified_hessian(H, floor), check_finite(grad, "gradient"))
    largest = float(np.max(np.abs(step)))
    if bound is not None and largest > bound:
        step *= bound / largest
    return np.asarray(u, dtype=float) + step


def loglik_from_f(f_total: float, n_obs: int) -> float:
    """ℓ_LR = −min_{μ,Σ} f − (N/2) log 2π, with f evaluated at the closed-form (μ, Σ) (Eq. 5, SPEC §1)."""
    return -float(f_total) - 0.5 * n_obs * LOG_2PI
