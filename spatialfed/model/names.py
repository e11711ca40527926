"""The names that travel between the layers, as enums: the protocol's sub-steps and the residual structures.

`StrEnum` members are their strings (``Step.THETA == "theta"``), so trace rows, result files, JSON checkpoints and
task keys keep plain names, while code that reads them gets one definition and a clear error for a misspelling.
"""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    """What a site is asked to compute (SPEC §3–4, §2b)."""

    MOMENTS = "moments"      # summaries for φ₀ (start.py)
    VARIOGRAM = "variogram"  # binned semivariogram of local residuals (start.py)
    MU_SIGMA = "mu_sigma"    # A_j, b_j (and, with mean_step="joint", the gamma quantities)
    GAMMA = "gamma"          # X_jᵀR_j⁻¹X_j, X_jᵀR_j⁻¹(z_j − B_jμ)
    THETA = "theta"          # ∂f_j/∂u, ∂²f_j/∂u², G_j of Eq. (16), f_j
    VALUE = "value"          # f_j at the final estimate
    FGPR = "fgpr"            # FGPR's local update
    STATS = "stats"          # sufficient statistics and their u-derivatives (one round trip, SPEC §2b)
    PILOT = "pilot"          # the same on a seeded subsample of the site (the pilot start, algorithm/pilot.py)


class Residual(StrEnum):
    """Residual structure w̃ of Remark 3 (SPEC §1)."""

    FULL = "full"  # C_jj − B_j C(S*, S_j) + δ⁻¹I
    MPP = "mpp"    # its diagonal + δ⁻¹I
    PP = "pp"      # δ⁻¹I
    VECCHIA = "vecchia"  # the full residual's Vecchia approximation (SPEC §2c)


#: the sub-steps of one block iteration, in their cyclic order (Eq. 12)
BLOCK_STEPS = (Step.MU_SIGMA, Step.GAMMA, Step.THETA)
RESIDUALS = tuple(r.value for r in Residual)
#: what a user may ask for: a structure, or "auto" (each site: `full` up to VECCHIA_AUTO_N points, `vecchia` above;
#: model/local.py resolve_residual)
RESIDUAL_CHOICES = RESIDUALS + ("auto",)
#: what a fit's `distance` may be: planar in the store's CRS, or chordal on the sphere (data/space.py)
DISTANCES = ("planar", "chordal")


def pairs(q: int) -> tuple[tuple[int, int], ...]:
    """(a, b) pairs with a ≤ b of a q-vector u, in the order of every second-derivative array ("d2S", "d2d")."""
    return tuple((a, b) for a in range(q) for b in range(a, q))


#: pairs(3) of u = (log δ, log σ², log β), the fixed-ν isotropic model's coordinates
PAIRS = pairs(3)
