"""The server's side of SPEC §2b: from summed sufficient statistics, the exact profile log-likelihood in u with its
gradient and Hessian, second-order Taylor models of stale sites, and a safeguarded (trust-region) Newton step.

With F = S + blockdiag(K⁻¹, 0, 0) (the quadratic form of (−μ, −γ, 1) in μᵀK⁻¹μ + rᵀR⁻¹r), A = F[:m+p, :m+p],
b = F[:m+p, z], M = F_BB = K⁻¹ + S_BB:
    Σ = M⁻¹,  (μ, γ̂) = A⁻¹b  (μ = Σ(S_Bz − S_BXγ̂), GLS γ̂),  Q̂ = F_zz − bᵀA⁻¹b,
    −2ℓ_LR(γ̂(u), u) = N log 2π + d + log det K + log det M + Q̂.
With v = (−μ, −γ̂, 1), F_a = ∂F/∂u_a and w_a = (F_a v)[:m+p] (envelope theorem for the minimum over (μ, γ)):
    ∂_a Q̂ = vᵀF_a v,   ∂_ab Q̂ = vᵀF_ab v − 2 w_aᵀA⁻¹w_b,
    ∂_a log det M = tr(ΣM_a),  ∂_ab log det M = tr(ΣM_ab) − tr(ΣM_aΣM_b),  same for K;  ∂K⁻¹ = −K⁻¹K_aK⁻¹.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import linalg

from spatialfed.errors import SpatialFedError
from spatialfed.model.blocks import LOG_2PI, KnotCovariance, modified_hessian
from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import FamilyKnots
from spatialfed.model.names import pairs
from spatialfed.model.stats import PAIRS, SUMMED

#: names of the entries of u
U_NAMES = ("delta", "sigma2", "beta")


def pair_table(q: int) -> np.ndarray:
    """q×q table of positions in pairs(q)."""
    pr = pairs(q)
    return np.array([[pr.index((min(a, b), max(a, b))) for b in range(q)] for a in range(q)])


#: 3×3 table of positions in PAIRS
_PAIR = pair_table(3)
#: distinct triples (a ≤ b ≤ c) of the third derivatives "d3S" and "d3d" a third-order model carries (stale.secant)
TRIPLES = tuple(itertools.combinations_with_replacement(range(3), 3))
#: 3×3×3 table of positions in TRIPLES
_TRIPLE = np.array([[[TRIPLES.index(tuple(sorted((a, b, c)))) for c in range(3)] for b in range(3)] for a in range(3)])
#: keys of a third-order model's third derivatives and the radius around u_j within which they are used: dropped
#: by point evaluations and combinations (second order)
THIRD = ("d3S", "d3d", "d3_radius")


def distance(u, v) -> float:
    """The one distance between points of u = (log δ, log σ², log β) in the statistics scheme: Euclidean, as the
    trust region's ball (a model's reach, a step's length, a site's staleness in u)."""
    return float(np.linalg.norm(np.asarray(u, dtype=float) - np.asarray(v, dtype=float)))


class NotPositiveDefinite(SpatialFedError):
    """A (model of the) summed statistics gives an M or A that is not positive definite at this u."""


@dataclass(frozen=True)
class Profile:
    """ℓ_LR(γ̂(u), u) at u with its gradient and Hessian in u (of ℓ, not −ℓ), and Σ, μ, γ̂ at u."""

    u: np.ndarray
    loglik: float
    grad: np.ndarray | None
    hess: np.ndarray | None
    mu: np.ndarray
    Sigma: np.ndarray
    gamma: np.ndarray
    n_obs: int


def sum_statistics(stats: list[dict], scale: float = 1.0) -> dict:
    """Σ_j of site statistics taken at the same u (SPEC §2b: S = Σ S_j, d = Σ d_j, ...), times `scale`."""
    if not stats:
        raise ValueError("no site statistics to sum")
    u = np.asarray(stats[0]["u"], dtype=float)
    for st in stats[1:]:
        if not np.array_equal(np.asarray(st["u"], dtype=float), u):
            raise ValueError("site statistics computed at different u cannot be summed: evaluate their Taylor models "
                             "at one u first (taylor_statistics)")
    out = {"u": u, "m": int(stats[0]["m"]), "p": int(stats[0]["p"])}
    cs = [np.asarray(st["c"], dtype=float) for st in stats if "c" in st]
    if len(cs) == len(stats) and all(np.array_equal(c, cs[0]) for c in cs):
        out["c"] = cs[0]  # the sum scales exactly along c when every site's statistics do
    for key in SUMMED:
        out[key] = scale * sum(np.asarray(st[key], dtype=float) for st in stats)
    return out


def exact_scaling(stats: dict) -> np.ndarray:
    """w = c/|c|², with which S(u_j + Δ) = e^{w·Δ}G(Δ) and G is constant along c (0 when "c" is absent or 0)."""
    c = np.asarray(stats.get("c", np.zeros(np.size(stats["u"]))), dtype=float)
    return c / float(c @ c) if np.any(c) else c


def scaled_frame(stats: dict, w: np.ndarray, packed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """G = S, ∂_aG = ∂_aS − w_aS, ∂_abG = ∂_abS − w_a∂_bS − w_b∂_aS + w_aw_bS at the statistics' own u (3×k×k and
    3×3×k×k, or with `packed` the second derivatives in PAIRS order, 6×k×k): S with its exact scaling e^{w·Δ} taken
    out."""
    S, dS, d2S = (np.asarray(stats[key], dtype=float) for key in ("S", "dS", "d2S"))
    q = dS.shape[0]
    if np.any(w):
        ab = np.array(pairs(q)).T
        wa, wb = (np.reshape(w[i], (len(ab[0]),) + (1,) * S.ndim) for i in ab)
        d2S = d2S - wa * dS[ab[1]] - wb * dS[ab[0]] + wa * wb * S
        dS = dS - np.reshape(w, (q,) + (1,) * S.ndim) * S
    return (S, dS, d2S) if packed else (S, dS, d2S[pair_table(q)])


def taylor_statistics(stats: dict, u) -> dict:
    """The Taylor model of a site's statistics around the u_j they were computed at, evaluated at u (Δ = u − u_j),
    with the model's own first and second derivatives at u; exact at u = u_j. Second order, or third when the
    statistics carry third derivatives "d3S", "d3d" (from the site's earlier answers, stale.secant) and u lies
    within their "d3_radius" of u_j (farther, the cubic term of forward differences is an extrapolation that can
    invent ascent: on graded n_j = 500 a flat ridge led the surrogate 0.4 in log β away with it, 0.28 without).

    S is expanded after taking out its exact scaling along stats["c"] (S = e^{w·Δ}G, w = c/|c|², G constant along c: c =
    (1, −1, 0) for full/mpp since R_j = σ²W̃ + δ⁻¹I, c = (1, 0, 0) for pp since R_j = δ⁻¹I; scaled_frame):
    S(u) ≈ e^{w·Δ}[G + Σ_a ∂_aG Δ_a + ½ Σ_ab ∂_abG Δ_aΔ_b (+ ⅙ Σ_abc ∂_abcG Δ_aΔ_bΔ_c)] (the plain expansion when "c"
    is absent or 0). d_j is expanded plainly (its c-part is linear).
    """
    u = np.asarray(u, dtype=float)
    D = u - np.asarray(stats["u"], dtype=float)
    out = {key: value for key, value in stats.items() if key not in THIRD}
    out["u"] = u
    if not np.any(D):
        return out
    w = exact_scaling(stats)
    G, dG, d2G = scaled_frame(stats, w)
    d2d = np.asarray(stats["d2d"])[pair_table(D.size)]
    d2GD = np.einsum("abij,b->aij", d2G, D)
    dG_new = dG + d2GD
    G_new = G + np.einsum("aij,a->ij", dG + 0.5 * d2GD, D)
    out["d"] = float(stats["d"] + stats["dd"] @ D + 0.5 * D @ d2d @ D)
    out["dd"] = stats["dd"] + d2d @ D
    if "d3S" in stats and float(np.linalg.norm(D)) <= float(stats.get("d3_radius", np.inf)):
        # Σ_c ∂_abcG Δ_c, and its share of the first derivatives and of G
        TD = np.einsum("abcij,c->abij", np.asarray(stats["d3S"])[_TRIPLE], D)
        TDD = np.einsum("abij,b->aij", TD, D)
        d2G, dG_new = d2G + TD, dG_new + 0.5 * TDD
        G_new = G_new + np.einsum("aij,a->ij", TDD, D) / 6.0
        TdD = np.asarray(stats["d3d"])[_TRIPLE] @ D
        out["d"] += float(D @ TdD @ D) / 6.0
        out["dd"] = out["dd"] + 0.5 * TdD @ D
        out["d2d"] = np.array([(d2d + TdD)[a, b] for a, b in PAIRS])
    scale = float(np.exp(w @ D))
    wdG = np.einsum("a,bij->abij", w, dG_new)
    out["S"] = scale * G_new
    out["dS"] = scale * (dG_new + w[:, None, None] * G_new)
    full = scale * (d2G + wdG + wdG.transpose(1, 0, 2, 3) + np.einsum("a,b,ij->abij", w, w, G_new))
    out["d2S"] = np.stack([full[a, b] for a, b in pairs(D.size)])
    return out


def _cho(A: np.ndarray, what: str):
    try:
        return linalg.cho_factor(A, lower=True, check_finite=True)
    except (linalg.LinAlgError, ValueError):
        raise NotPositiveDefinite(f"{what} is not positive definite at this u") from None


def knot_terms(knots, kernel, u):
    """K = σ²ρ_K at u with K⁻¹, log det K and their u-derivatives: KnotCovariance for a Matern, FamilyKnots for a
    MaternFamily (the knot block profile_loglik adds to the summed S)."""
    if isinstance(kernel, MaternFamily):
        return FamilyKnots(knots, kernel, u)
    return KnotCovariance(knots, kernel, float(np.exp(u[1])), float(np.exp(u[2])))


def knot_posterior(F: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, tuple | None, tuple]:
    """(x = (μ, γ̂) = A⁻¹b, Σ = M⁻¹, the Cholesky factors of M and A) of F = S + blockdiag(K⁻¹, 0, 0) (module
    docstring); NotPositiveDefinite when M or A is not."""
    Mcf = _cho(F[:m, :m], "M = K⁻¹ + Σ_j B_jᵀR_j⁻¹B_j") if m else None
    Sigma = linalg.cho_solve(Mcf, np.eye(m)) if m else np.zeros((0, 0))
    Acf = _cho(F[:-1, :-1], "the (μ, γ) normal matrix (collinear covariates?)")
    return linalg.cho_solve(Acf, F[:-1, -1]), 0.5 * (Sigma + Sigma.T), Mcf, Acf


def profile_loglik(stats: dict, knots, kernel, derivatives: bool = True) -> Profile:
    """ℓ_LR with γ profiled out (SPEC §1, with the −N/2 log 2π constant), Σ, μ, γ̂ and, if asked, the exact gradient
    and Hessian in u, from summed statistics at stats["u"] (sum_statistics / taylor_statistics)."""
    u = np.asarray(stats["u"], dtype=float)
    q, pr = u.size, pairs(u.size)
    m, N = int(stats["m"]), int(round(float(stats["n"])))
    F = np.array(stats["S"], dtype=float)
    k = F.shape[0]
    logdetK = 0.0
    if m:
        kc = knot_terms(knots, kernel, u)
        Ki = kc.Kinv
        F[:m, :m] += Ki
        logdetK = kc.logdet
    x, Sigma, Mcf, Acf = knot_posterior(F, m)
    logdetM = 2.0 * float(np.sum(np.log(np.diag(Mcf[0])))) if m else 0.0
    b = F[:-1, -1]
    Q = float(F[-1, -1] - b @ x)
    if not Q > 0:
        raise NotPositiveDefinite("the profiled quadratic form is not positive at this u")
    loglik = -0.5 * (N * LOG_2PI + float(stats["d"]) + logdetK + logdetM + Q)
    grad = hess = None
    if derivatives:
        v = np.append(-x, 1.0)
        Fa = np.array(stats["dS"], dtype=float)
        Fab = np.asarray(stats["d2S"], dtype=float)[pair_table(q)].copy()
        g2 = np.array(stats["dd"], dtype=float).copy()
        H2 = np.asarray(stats["d2d"], dtype=float)[pair_table(q)].copy()
        if m:
            dKi, d2Ki, dlogdet, d2logdet = kc.inverse_derivatives()
            for a in range(q):
                Fa[a, :m, :m] += dKi[a]
            for a, b in pr:
                Fab[a, b, :m, :m] += d2Ki[a][b]
                Fab[b, a, :m, :m] = Fab[a, b, :m, :m]
            g2 += dlogdet
            H2 += d2logdet
            SMa = [Sigma @ Fa[a, :m, :m] for a in range(q)]
            for a in range(q):
                g2[a] += np.trace(SMa[a])
            for a, b in pr:
                H2[a, b] += np.sum(Sigma * Fab[a, b, :m, :m]) - np.sum(SMa[a] * SMa[b].T)
                H2[b, a] = H2[a, b]
        Fv = np.einsum("aij,j->ai", Fa, v)
        w = Fv[:, :-1]
        AiW = linalg.cho_solve(Acf, w.T)
        g2 += Fv @ v
        H2 += np.einsum("abij,i,j->ab", Fab, v, v) - 2.0 * w @ AiW
        grad, hess = -0.5 * g2, -0.25 * (H2 + H2.T)
    return Profile(u=u, loglik=float(loglik), grad=grad, hess=hess, mu=x[:m], Sigma=Sigma, gamma=x[m:k - 1],
                   n_obs=N)


def default_bounds(s2: float, diameter: float) -> tuple[np.ndarray, np.ndarray]:
    """Box for u: nugget variance 1/δ and σ² in [1e-6, 1e4]·s², β in [1e-4, 1e2]·D (s² the pooled OLS residual
    variance, D the study diameter). A parameter that reaches its bound is reported, not pushed beyond."""
    s2 = float(s2)
    lo = np.log([1e-4 / s2, 1e-6 * s2, 1e-4 * diameter])
    hi = np.log([1e6 / s2, 1e4 * s2, 1e2 * diameter])
    return lo, hi


def pushing_out(u, grad, lower, upper, atol: float = 0.0) -> np.ndarray:
    """Entries of u on a bound of [lower, upper] (within atol) whose gradient of ℓ pushes them out: held there."""
    g = np.asarray(grad, dtype=float)
    return ((u <= lower + atol) & (g < 0)) | ((u >= upper - atol) & (g > 0))


def projected_gradient(u, grad, lower, upper, atol: float = 1e-10) -> np.ndarray:
    """The gradient of ℓ with the components that push u out of [lower, upper] at an active bound set to 0."""
    g = np.array(grad, dtype=float)
    g[pushing_out(u, g, lower, upper, atol)] = 0.0
    return g


def at_bound(u, lower, upper, names=U_NAMES) -> tuple[str, ...]:
    """Names (`names`, then u[i] beyond them) of the entries of u on a bound of the box [lower, upper]."""
    names = tuple(names) + tuple(f"u[{i}]" for i in range(len(names), len(u)))
    return tuple(names[i] for i in range(len(u)) if u[i] <= lower[i] or u[i] >= upper[i])


@dataclass(frozen=True)
class TrustStep:
    """A trust-region step p on ℓ from u: `predicted` = model increase gᵀp − ½pᵀmod(−H)p ≥ 0; `at_bound` the
    entries of u + p on a bound of the box."""

    p: np.ndarray
    predicted: float
    at_bound: tuple[str, ...]


def updated_radius(radius: float, ratio: float, step: float, cap: float) -> float:
    """Trust radius from actual / predicted increase of ℓ: shrink below 0.25, grow (up to `cap`) above 0.75 when the
    step reached the radius (Nocedal & Wright, Alg. 4.1)."""
    if ratio < 0.25:
        return max(0.25 * step, 1e-6)
    if ratio > 0.75 and step >= 0.99 * radius:
        return min(2.0 * radius, cap)
    return radius


def trust_region_step(u, grad, hess, radius: float, lower, upper, floor: float = 1e-8) -> TrustStep:
    """argmax of the quadratic model gᵀp + ½pᵀHp with H replaced by −mod(−H) (SPEC §2: |eigenvalues|, floored),
    over ‖p‖₂ ≤ radius (Levenberg–Marquardt multiplier by bisection) and u + p in [lower, upper] (entries that leave
    the box are fixed on the bound and the others re-solved)."""
    u, g = np.asarray(u, dtype=float), np.asarray(grad, dtype=float)
    B = modified_hessian(-np.asarray(hess, dtype=float), floor)
    fixed = np.zeros(u.size, dtype=bool)
    p = np.zeros(u.size)
    for _ in range(4):
        fixed |= pushing_out(u, g, lower, upper)
        free = ~fixed
        rhs = g[free] - B[np.ix_(free, fixed)] @ p[fixed]
        Bf = B[np.ix_(free, free)]
        r_free = np.sqrt(max(radius**2 - float(p[fixed] @ p[fixed]), 0.0))
        pf = _lm_solve(Bf, rhs, r_free) if free.any() else np.zeros(0)
        p[free] = pf
        target = np.clip(u + p, lower, upper)
        clipped = free & (target != u + p)
        if not clipped.any():
            break
        p[clipped] = target[clipped] - u[clipped]
        fixed |= clipped
    p = np.clip(u + p, lower, upper) - u
    predicted = float(g @ p - 0.5 * p @ B @ p)
    return TrustStep(p=p, predicted=predicted, at_bound=at_bound(u + p, lower, upper))


def _lm_solve(B: np.ndarray, g: np.ndarray, radius: float) -> np.ndarray:
    """p = (B + λI)⁻¹g with the smallest λ ≥ 0 giving ‖p‖₂ ≤ radius (B symmetric positive definite)."""
    if radius <= 0 or not np.any(g):
        return np.zeros_like(g)
    p = np.linalg.solve(B, g)
    if np.linalg.norm(p) <= radius:
        return p
    lo, hi = 0.0, float(np.linalg.norm(g)) / radius
    eye = np.eye(B.shape[0])
    for _ in range(60):
        lam = 0.5 * (lo + hi)
        if np.linalg.norm(np.linalg.solve(B + lam * eye, g)) > radius:
            lo = lam
        else:
            hi = lam
    return np.linalg.solve(B + hi * eye, g)


def newton_length(step: TrustStep, hess, radius: float, floor: float) -> float | None:
    """‖p‖∞ of a pure Newton step p = −H⁻¹g (−H positive definite, p strictly inside the trust radius and the box),
    else None: only such steps converge quadratically near the maximum (Nocedal & Wright, Thm 3.5)."""
    if step.at_bound or float(np.linalg.norm(step.p)) >= 0.99 * radius:
        return None
    if float(np.linalg.eigvalsh(-np.asarray(hess, dtype=float)).min()) <= floor:
        return None
    return float(np.max(np.abs(step.p)))


#: the smallest tol a predicted stop may claim: steps below √ε (double precision) are not resolved by steps computed
#: from sums of n_j-term statistics, so only a round can show them (tol 1e-12 runs to max_iter, as it always did)
RESOLVED = float(np.sqrt(np.finfo(float).eps))


def newton_settled(before: Profile | None, base: Profile, step: TrustStep, dgamma: float, tol: float,
                   loglik_tol: float) -> bool:
    """Whether the round at base.u + p (p the pure Newton step from base) may be skipped. Newton's error bound
    ‖p_next‖ ≤ ½L‖H⁻¹‖‖p‖² (L the Lipschitz constant of the Hessian H of ℓ in u; Kantorovich) with L measured
    between the last two exact points, L ≈ ‖H − H_before‖/‖u − u_before‖, predicts the next step; its γ change and
    ℓ gain shrink with it (linearly, quadratically). When these meet the stop rule, base.u + p is where that round
    would stop (docs/algorithm.md, "Stopping"). Norms are spectral and Euclidean."""
    if before is None or before.hess is None or base.hess is None or tol < RESOLVED:
        return False
    moved = float(np.linalg.norm(np.asarray(base.u, dtype=float) - before.u))
    if moved == 0.0:
        return False
    lipschitz = float(np.linalg.norm(base.hess - before.hess, 2)) / moved
    following = 0.5 * lipschitz * float(np.linalg.norm(np.linalg.inv(base.hess), 2)) * float(step.p @ step.p)
    shrink = following / max(float(np.max(np.abs(step.p))), 1e-300)
    return shrink < 1.0 and max(following, shrink * dgamma) <= tol and shrink**2 * step.predicted <= loglik_tol


def stop_point(base: Profile, new: Profile | None, step: TrustStep, dgamma: float, before: Profile | None,
               newton: float | None, tol: float, loglik_tol: float) -> Profile | None:
    """Where an epoch at base ends the fit (None: it goes on): base when its step p and γ change are within tol and
    the gain within loglik_tol; new = base + p (second-order model) when p is a pure Newton step (`newton`, from
    newton_length) and newton_settled, from the exact point `before` base, predicts that the round at new would
    stop."""
    if max(float(np.max(np.abs(step.p))), dgamma) <= tol and step.predicted <= loglik_tol:
        return base
    if new is not None and newton is not None and newton_settled(before, base, step, dgamma, tol, loglik_tol):
        return new
    return None


def maximise(evaluate, base: Profile, max_move: float, lower, upper, steps: int, floor: float,
             tol: float) -> tuple[Profile, TrustStep]:
    """Safeguarded Newton iterations on u ↦ evaluate(u) (a Profile with derivatives, or None where it is not positive
    definite) from base.u, each kept only if ℓ does not decrease, within ‖u − base.u‖ ≤ max_move, at most `steps`,
    until a step is ≤ tol; returns (the point reached, its last step)."""
    cur, r, last = base, max_move, None
    for _ in range(steps):
        room = max_move - distance(cur.u, base.u)
        if room <= 1e-12:
            break
        step = trust_region_step(cur.u, cur.grad, cur.hess, min(r, room), lower, upper, floor=floor)
        last = last or step
        if not np.any(step.p):
            last = step
            break
        trial = evaluate(cur.u + step.p)
        if trial is None or trial.loglik < cur.loglik:
            r = 0.25 * float(np.linalg.norm(step.p))
            continue
        cur, last = trial, step
        if float(np.max(np.abs(step.p))) <= tol:
            break
    if cur is base:  # no step kept: stay
        last = trust_region_step(base.u, base.grad, base.hess, 0.0, lower, upper)
    return cur, last
