"""The residual structures of Remark 3 (SPEC §2c) as strategies: one object per structure says what the layers
above need to know (is R_j diagonal, does the site krige a residual, does it keep its whitened data, the flops of
the statistics), so that no module outside model/ branches on a residual name.

The names stay the strings of fit.json and checkpoints: full, mpp, pp, vecchia (and "auto", resolved once at
settings time by `resolve_sites`)."""

from __future__ import annotations

from dataclasses import dataclass

from spatialfed.model.names import RESIDUAL_CHOICES, Residual
from spatialfed.model.vecchia_order import VECCHIA_AUTO_N

# the batched small products of a Vecchia site run at about a quarter of the dense residual's rate (model/stats.py)
VECCHIA_RATE_FACTOR = 4.0


@dataclass(frozen=True)
class ResidualStrategy:
    """One residual structure: `name` (the string in files) and what it implies."""

    name: str
    diagonal: bool  # R_j diagonal (mpp, pp)
    kriges: bool  # a residual to krige at prediction (all but pp)
    keeps_whitened: bool  # the site keeps L⁻¹[B, X, z] between tasks (a rebuild would refactorise R_j)
    block_scheme: bool  # the block scheme's theta step has a form for it
    correlated: bool  # a correlated residual for the boundary exchange (full, vecchia)
    dense: bool  # R_j an n_j × n_j matrix, factorised (full)
    pointwise: bool  # whitened point by point through k neighbours, no n_j × n_j array (vecchia)
    scale_direction: tuple  # c with S(u + sc) = e^{s}S(u) (SPEC §2b): (1, −1, 0) when R_j = σ²W̃ + δ⁻¹I, (1, 0, 0) for pp

    def stats_flops(self, n: int, m: int, p: int, vecchia_k: int) -> float:
        """Floating-point operations of site_statistics (standard counts: a product of n×a by a×b is 2nab).

        full: R_j (n²m), Cholesky (n³/3), inverse (2n³/3), PR_β (2n³), seven n×n by n×k products, ~14 n×k by k×k
        Gram products. mpp/pp: R_j (2nm²) and the Gram products. vecchia (k neighbours, model/vecchia.py): the
        whitened knot basis (12nm²) and per point four (k+1)×m by m×(k+1) products, three LU solves of k × k with
        ten right-hand sides, the local kernel and 10 × (k+1) by (k+1) × q coefficients, 19 rank-one q × q Gram
        terms; counted VECCHIA_RATE_FACTOR times, as these batched small products run at about a quarter of the
        rate of the dense residual's large ones (docs/results.md), so that the virtual clock charges both
        structures their measured time."""
        k = m + p + 1
        grams = 14 * 2.0 * n * k * k
        if self.pointwise:
            c = min(int(vecchia_k), max(n - 1, 1)) + 1
            per_point = (8.0 * c * c * m + 2.0 * (c - 1) ** 3 + 40.0 * c * c + 20.0 * c * k + 8.0 * c * m
                         + 10.0 * m * m + 38.0 * k * k)
            return VECCHIA_RATE_FACTOR * (12.0 * n * m * m + n * per_point)
        if self.dense:
            return 2.0 * n * n * m + n**3 / 3 + 2 * n**3 / 3 + 2.0 * n**3 + 7 * 2.0 * n * n * k + grams
        return 2.0 * n * m * m + 6 * 2.0 * n * m * m + grams

    def solve_flops(self, n: int, m: int, p: int, vecchia_k: int) -> float:
        """Flops of one block-scheme sub-step (whitening the data): a factorisation of R_j for full, O(n m²) for the
        diagonal residuals, about the statistics' share without the derivatives for Vecchia."""
        if self.pointwise:
            return self.stats_flops(n, m, p, vecchia_k) / 4
        return n**3 / 3 + n * n * m if self.dense else n * m * m


_STRATEGIES = {
    "full": ResidualStrategy("full", diagonal=False, kriges=True, keeps_whitened=True, block_scheme=True,
                             correlated=True, dense=True, pointwise=False, scale_direction=(1.0, -1.0, 0.0)),
    "mpp": ResidualStrategy("mpp", diagonal=True, kriges=True, keeps_whitened=False, block_scheme=True,
                            correlated=False, dense=False, pointwise=False, scale_direction=(1.0, -1.0, 0.0)),
    "pp": ResidualStrategy("pp", diagonal=True, kriges=False, keeps_whitened=False, block_scheme=True,
                           correlated=False, dense=False, pointwise=False, scale_direction=(1.0, 0.0, 0.0)),
    "vecchia": ResidualStrategy("vecchia", diagonal=False, kriges=True, keeps_whitened=False, block_scheme=False,
                                correlated=True, dense=False, pointwise=True, scale_direction=(1.0, -1.0, 0.0)),
}


def residual_strategy(name: str) -> ResidualStrategy:
    """The strategy of a resolved residual name (full, mpp, pp, vecchia)."""
    try:
        return _STRATEGIES[str(name)]
    except KeyError:
        raise ValueError(f"residual must be one of {tuple(_STRATEGIES)} once resolved, got {name!r}") from None


def check_residual(residual: str) -> str:
    """Validate the residual structure name of Remark 3 (or "auto", SPEC §2c)."""
    if residual not in RESIDUAL_CHOICES:
        raise ValueError(f"residual must be one of {RESIDUAL_CHOICES} (Remark 3, SPEC §2c), got {residual!r}")
    return residual if str(residual) == "auto" else Residual(residual)


def resolve_residual(residual: str, n: int) -> Residual:
    """The structure a site of n points uses: "auto" is `full` up to VECCHIA_AUTO_N points, `vecchia` above."""
    if check_residual(residual) == "auto":
        return Residual.VECCHIA if n > VECCHIA_AUTO_N else Residual.FULL
    return Residual(residual)


def keeps_local_covariance(name: str) -> bool:
    """Whether a fit with this residual keeps each site's full local covariance, as the independence model (Eq. 3)
    and FGPR need: `full`, or "auto" (which they resolve to `full`)."""
    return str(name) == "auto" or residual_strategy(name) is _STRATEGIES["full"]


def may_be_vecchia(name: str) -> bool:
    """Whether sites of a fit with this residual (possibly "auto", resolved per site) may use Vecchia."""
    return str(name) == "auto" or residual_strategy(name).pointwise


def resolve_sites(residual: str, sizes, block: bool) -> str:
    """The residual the sites of a low-rank fit use (fit.json "residual"): "auto" is `full` with the block scheme
    (its theta step has no Vecchia form), else the structure every site resolves to (full up to VECCHIA_AUTO_N
    points, vecchia above), or stays "auto" when the sizes straddle VECCHIA_AUTO_N (each site resolves its own)."""
    if str(residual) != "auto":
        if block and not residual_strategy(residual).block_scheme:
            raise ValueError(f"residual={str(residual)!r} needs the statistics scheme (strategies='stats' / --preset "
                             "stats, the default): the block scheme's theta step has no Vecchia form; drop the "
                             "preset or use residual='full'")
        return str(residual)
    if block:
        return "full"
    kinds = {"vecchia" if int(n) > VECCHIA_AUTO_N else "full" for n in sizes}
    return kinds.pop() if len(kinds) == 1 else "auto"
