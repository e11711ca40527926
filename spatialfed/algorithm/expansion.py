"""A weighted sum of the Taylor models of site statistics (likelihood.taylor_statistics), re-expanded once around one
centre so that evaluating it costs about one model's evaluation instead of one per site: the asynchronous server
evaluates its surrogate Σ_j T_j(u) (stale.site_models) at every inner step of a maximisation.

Model j is e^{w·Δ_j} Q_j(Δ_j), Δ_j = u − u_j, with Q_j a quadratic polynomial in the scaled frame (likelihood.scaled_frame)
plus, within d3_radius of u_j, a cubic term ⅙ ∂³G[Δ_j, Δ_j, Δ_j]. With one w for all models and D = u − u_c,
    Σ_j c_j e^{w·Δ_j} Q_j(Δ_j) = e^{w·D} Σ_j c_j e^{w·(u_c − u_j)} Q_j(u_c − u_j + D),
a quadratic polynomial in D whose coefficients are the models' derivatives at u_c (exact: re-expanding a polynomial
around another point loses nothing). The cubic terms switch off outside their radii, so they are added one by one
where they apply. d_j is expanded plainly (w = 0) the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

import itertools
from functools import lru_cache

from spatialfed.algorithm.likelihood import exact_scaling, scaled_frame
from spatialfed.model.names import pairs


@lru_cache(maxsize=None)
def _tables(q: int) -> tuple[np.ndarray, np.ndarray]:
    """For u of q entries: _HD, (row a, pair r, index b) with H_ab in pair r, so (H D)_a = Σ_r H_r D_b; and _TD,
    (pair r, triple t, index c) with T_abc in triple t for (a, b) = pairs(q)[r], so (T D)_ab = Σ_t T_t D_c."""
    pr = pairs(q)
    triples = tuple(itertools.combinations_with_replacement(range(q), 3))
    hd = np.array([(a, r, b) for r, (x, y) in enumerate(pr) for a, b in {(x, y), (y, x)}]).T
    td = np.array([(r, triples.index(tuple(sorted((a, b, c)))), c) for r, (a, b) in enumerate(pr)
                   for c in range(q)]).T
    return hd, td


def _contract(index: np.ndarray, shape: tuple, D: np.ndarray) -> np.ndarray:
    """The matrix that contracts symmetric coefficients with D (index: a table of _tables)."""
    out = np.zeros(shape)
    np.add.at(out, (index[0], index[1]), D[index[2]])
    return out


def _sizes(q: int) -> tuple[int, int]:
    """(pairs, triples) of a q-vector."""
    return q * (q + 1) // 2, q * (q + 1) * (q + 2) // 6


class _Poly:
    """A quadratic polynomial in packed form: value G (n,), gradient g (q, n), Hessian H (pairs, n) in pairs(q)
    order at its centre, each entry flattened (n = k·k for S's frame, 1 for d)."""

    def __init__(self, G, g, H):
        self.G, self.g, self.H = G, g, H

    def at(self, D: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, gradient, Hessian) at centre + D."""
        q = D.size
        HD = _contract(_tables(q)[0], (q, _sizes(q)[0]), D) @ self.H
        return self.G + D @ (self.g + 0.5 * HD), self.g + HD, self.H


def _cubic(T: np.ndarray, D: np.ndarray):
    """(⅙ T[D,D,D], ½ T[D,D,·], T[D,·,·] packed as pairs) for a symmetric third derivative T (triples, n) in
    combinations-with-replacement order."""
    q = D.size
    hd, td = _tables(q)
    TD = _contract(td, _sizes(q), D) @ T
    TDD = _contract(hd, (q, _sizes(q)[0]), D) @ TD
    return (D @ TDD) / 6.0, 0.5 * TDD, TD


def _frame(st: Mapping, w: np.ndarray, n: int, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """likelihood.scaled_frame packed and flattened to (n,), (q, n), (pairs, n)."""
    S, dS, d2S = scaled_frame(st, w, packed=True)
    return np.reshape(S, n), np.reshape(dS, (q, n)), np.reshape(d2S, (_sizes(q)[0], n))


class Expansion:
    """u ↦ Σ_i c_i T_i(u) for `terms` [(statistics, c_i)], T_i = taylor_statistics(statistics_i, ·), returned as one
    statistics dict (as likelihood.sum_statistics would return the sum of the evaluations), times `scale`.

    The terms' quadratic parts are summed around `center` once; a term's cubic part (statistics with "d3S", "d3d")
    is added where u lies within its "d3_radius" of its u_i."""

    def __init__(self, terms: Sequence[tuple[Mapping, float]], center, scale: float = 1.0):
        terms = [(st, float(c)) for st, c in terms if c != 0.0]
        if not terms:
            raise ValueError("no site statistics to expand")
        first = terms[0][0]
        self.center, self.scale = np.asarray(center, dtype=float), float(scale)
        self.m, self.p = int(first["m"]), int(first["p"])
        self.shape = np.shape(first["S"])
        self.q = int(np.prod(self.shape))
        self.n = float(sum(c * float(st["n"]) for st, c in terms))
        cs = [np.asarray(st["c"], dtype=float) for st, _ in terms if "c" in st]
        self.c = cs[0] if len(cs) == len(terms) and all(np.array_equal(c, cs[0]) for c in cs) else None
        by_scaling: dict[bytes, list] = {}
        for st, c in terms:
            by_scaling.setdefault(exact_scaling(st).tobytes(), []).append((st, c))
        # per scaling w: (w, the frame's Poly, d's Poly, [(u_i, c_i, T_i, T^d_i, radius)])
        self.groups = [self._group(np.frombuffer(key), members) for key, members in by_scaling.items()]

    def _group(self, w: np.ndarray, members):
        n, q = self.q, self.center.size
        npair, ntrip = _sizes(q)
        G, g, H = np.zeros(n), np.zeros((q, n)), np.zeros((npair, n))
        d, dd, d2d = np.zeros(1), np.zeros((q, 1)), np.zeros((npair, 1))
        cubics = []
        for st, c in members:
            u0 = np.asarray(st["u"], dtype=float)
            e = self.center - u0
            Fc, gc, Hc = _Poly(*_frame(st, w, n, q)).at(e)
            s = c * float(np.exp(w @ e))
            G += s * Fc
            g += s * gc
            H += s * Hc
            own = _Poly(np.atleast_1d(float(st["d"])), np.reshape(np.asarray(st["dd"], dtype=float), (q, 1)),
                        np.reshape(np.asarray(st["d2d"], dtype=float), (npair, 1)))
            dc, gdc, Hdc = own.at(e)
            d += c * dc
            dd += c * gdc
            d2d += c * Hdc
            if "d3S" in st:
                cubics.append((u0, c, np.reshape(np.asarray(st["d3S"], dtype=float), (ntrip, n)),
                               np.reshape(np.asarray(st["d3d"], dtype=float), (ntrip, 1)),
                               float(st.get("d3_radius", np.inf))))
        return w, _Poly(G, g, H), _Poly(d, dd, d2d), cubics

    def __call__(self, u) -> dict:
        u = np.asarray(u, dtype=float)
        n, q, D = self.q, u.size, u - self.center
        npair = _sizes(q)[0]
        S, dS, d2S = np.zeros(n), np.zeros((q, n)), np.zeros((npair, n))
        d, dd, d2d = np.zeros(1), np.zeros((q, 1)), np.zeros((npair, 1))
        for w, frame, plain, cubics in self.groups:
            s = float(np.exp(w @ D))
            G, g, H = (s * x for x in frame.at(D))
            dv, gv, Hv = plain.at(D)
            for u0, c, T, Td, radius in cubics:
                Di = u - u0
                if float(np.linalg.norm(Di)) > radius:
                    continue
                si = c * float(np.exp(w @ Di))
                c0, c1, c2 = _cubic(T, Di)
                G, g, H = G + si * c0, g + si * c1, H + si * c2
                e0, e1, e2 = _cubic(Td, Di)
                dv, gv, Hv = dv + c * e0, gv + c * e1, Hv + c * e2
            S += G
            dS += g + w[:, None] * G
            d2S += H + np.stack([w[a] * g[b] + w[b] * g[a] + w[a] * w[b] * G for a, b in pairs(q)])
            d, dd, d2d = d + dv, dd + gv, d2d + Hv
        k = self.scale
        out = {"u": u, "m": self.m, "p": self.p, "n": k * self.n, "S": k * S.reshape(self.shape),
               "dS": k * dS.reshape((q, *self.shape)), "d2S": k * d2S.reshape((npair, *self.shape)),
               "d": k * float(d[0]), "dd": k * dd[:, 0], "d2d": k * d2d[:, 0]}
        if self.c is not None:
            out["c"] = self.c
        return out
