"""Secure aggregation of the sites' statistics (docs/secure-aggregation.md): sans-IO maths, no network.

Every number a site would send (all but the public keys of PUBLIC) is encoded in fixed point, x ↦ round(x·2^F) as a
signed integer mod 2^(64·LIMBS) (LIMBS little-endian uint64 limbs per number), and masked: for every other member k
of the round, site j adds (j < k) or subtracts (j > k) the ChaCha20 keystream keyed by HKDF-SHA256 of the X25519
shared secret of j and k, salted with the round's id. Each pair's mask enters the sum once with each sign, so

    Σ_j masked_j = Σ_j encode(x_j)   (mod 2^(64·LIMBS)),

which decodes to Σ_j x_j. The sum over any proper subset keeps the masks shared with the others and decodes to
noise; one site's masked integers are uniform to anyone without the secrets.

Range and precision: every number must satisfy |x| < 2^BOUND_BITS (≈ 1.3e30; ValueError otherwise); with up to
2^SITE_BITS sites the sum stays inside the signed range, as F + BOUND_BITS + SITE_BITS < 64·LIMBS − 1. Each number
is rounded to 2^−F−1 ≈ 2.5e−32 absolute, so the decoded sum equals the float sum to ~1e−16 relative (float64's own
rounding of the decoded limbs) plus J·2.5e−32 absolute.
"""

from __future__ import annotations

import weakref

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

LIMBS = 4  # 256-bit integers
FRACTION_BITS = 104  # F
BOUND_BITS = 100  # |x| < 2^100 for every encoded number
SITE_BITS = 20  # up to 2^20 sites in one sum
#: the fewest sites a round may sum over: with two, each learns the other's numbers from the sum and its own
MIN_SITES = 3
#: message keys sent in clear: the request's point (u, its scaling direction c), n_j and the model's sizes (m, p)
PUBLIC = ("u", "c", "n", "m", "p")
#: the key of a site's answer that carries only its public key (it holds no key matching the request's)
KEY_ANSWER = "secagg_public_key"
#: the key of a masked answer
MASKED = "secagg"
_INFO = b"spatialfed secure aggregation v1"
assert FRACTION_BITS + BOUND_BITS + SITE_BITS < 64 * LIMBS - 1


# --- fixed point mod 2^(64·LIMBS) ----------------------------------------------------------------------------
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b mod 2^(64·LIMBS), limb by limb with carries (arrays of shape (..., LIMBS), uint64)."""
    out = np.empty_like(a)
    carry = np.zeros(a.shape[:-1], dtype=np.uint64)
    for i in range(LIMBS):
        s = a[..., i] + b[..., i]
        c1 = s < a[..., i]
        s2 = s + carry
        out[..., i] = s2
        carry = (c1 | (s2 < s)).astype(np.uint64)
    return out


def negate(a: np.ndarray) -> np.ndarray:
    """−a mod 2^(64·LIMBS) (two's complement)."""
    one = np.zeros_like(a)
    one[..., 0] = 1
    return add(~a, one)


def encode(x) -> np.ndarray:
    """round(x·2^F) mod 2^(64·LIMBS) for a float vector x (n,) → uint64 (n, LIMBS). Every step is exact in float64:
    the scaling by a power of two, the rounding, and peeling the limbs off from the top."""
    x = np.asarray(x, dtype=float).reshape(-1)
    if not np.all(np.isfinite(x)) or np.any(np.abs(x) >= 2.0 ** BOUND_BITS):
        raise ValueError(f"a statistic is not finite or exceeds the secure-aggregation range |x| < 2^{BOUND_BITS}: "
                         "check the data for missing-value codes or rescale z and the covariates")
    y = np.rint(np.abs(x) * 2.0 ** FRACTION_BITS)
    out = np.zeros((x.size, LIMBS), dtype=np.uint64)
    for i in reversed(range(LIMBS)):
        base = 2.0 ** (64 * i)
        limb = np.floor(y / base)
        y = y - limb * base
        out[:, i] = limb.astype(np.uint64)
    neg = x < 0
    out[neg] = negate(out[neg])
    return out


def decode(a: np.ndarray) -> np.ndarray:
    """The float vector whose encoding is `a` (n, LIMBS): the inverse of `encode` on the signed range."""
    neg = (a[:, LIMBS - 1] >> np.uint64(63)) == 1
    mag = np.where(neg[:, None], negate(a), a)
    value = sum(mag[:, i].astype(float) * 2.0 ** (64 * i - FRACTION_BITS) for i in range(LIMBS))
    return np.where(neg, -value, value)


def total(parts) -> np.ndarray:
    """Σ parts mod 2^(64·LIMBS)."""
    parts = list(parts)
    out = parts[0].copy()
    for a in parts[1:]:
        out = add(out, a)
    return out


# --- keys and masks --------------------------------------------------------------------------------------------
def private_key(seed: bytes | None = None) -> X25519PrivateKey:
    """A fresh X25519 private key (from the OS's randomness; `seed`, 32 bytes, for reproducible tests only)."""
    return X25519PrivateKey.generate() if seed is None else X25519PrivateKey.from_private_bytes(seed)


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 bytes the server relays to the other sites."""
    return key.public_key().public_bytes_raw()


def pair_mask(key: X25519PrivateKey, j: int, k: int, peer: bytes, round_id: bytes, n: int) -> np.ndarray:
    """The mask sites j and k share in round `round_id`: n numbers of LIMBS uint64, the ChaCha20 keystream under
    HKDF-SHA256(X25519(j, k); salt = round id, info names the pair). Both sites derive the same, nobody else can."""
    lo, hi = sorted((int(j), int(k)))
    shared = key.exchange(X25519PublicKey.from_public_bytes(peer))
    info = _INFO + lo.to_bytes(4, "big") + hi.to_bytes(4, "big")
    stream_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=round_id, info=info).derive(shared)
    stream = Cipher(algorithms.ChaCha20(stream_key, bytes(16)), mode=None).encryptor().update(bytes(8 * LIMBS * n))
    return np.frombuffer(stream, dtype="<u8").reshape(n, LIMBS).astype(np.uint64)


def mask(values: np.ndarray, key: X25519PrivateKey, j: int, peers: dict, round_id: bytes) -> np.ndarray:
    """Site j's encoded `values` (n, LIMBS) plus its masks with every other member of `peers` ({k: public key}):
    added for k > j, subtracted for k < j."""
    out = values
    for k in sorted(peers):
        if k == j:
            continue
        m = pair_mask(key, j, k, peers[k], round_id, len(values))
        out = add(out, m if k > j else negate(m))
    return out


# --- messages ---------------------------------------------------------------------------------------------------
def protected_keys(xi: dict) -> list[str]:
    """The keys of a site's answer that are masked: every key but PUBLIC."""
    return sorted(key for key in xi if key not in PUBLIC)


def masked_message(xi: dict, key: X25519PrivateKey, j: int, peers: dict, round_id: bytes) -> dict:
    """Site j's answer with every protected number encoded and masked (the public keys in clear)."""
    names = protected_keys(xi)
    shapes = {name: np.shape(xi[name]) for name in names}
    flat = np.concatenate([np.asarray(xi[name], dtype=float).reshape(-1) for name in names])
    out = {name: xi[name] for name in PUBLIC if name in xi}
    out[MASKED] = {"round": bytes(round_id), "shapes": shapes, "data": mask(encode(flat), key, j, peers, round_id)}
    return out


def unmasked_sum(messages: list[dict]) -> dict:
    """Σ_j x_j of the protected numbers, from the masked messages of every member of one round (same shapes)."""
    shapes = messages[0][MASKED]["shapes"]
    if any(m[MASKED]["shapes"] != shapes for m in messages):
        raise ValueError("the sites' masked answers do not have the same keys and shapes: they cannot be summed")
    flat = decode(total(m[MASKED]["data"] for m in messages))
    out, at = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) if shape else 1
        value = flat[at:at + size]
        out[name] = value.reshape(shape) if shape else float(value[0])
        at += size
    return out


# --- the site's side ------------------------------------------------------------------------------------------
#: what a site keeps between requests, per LocalModel held in its process: its private key and the rounds it answered
_SITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def site_answer(lm, request: dict, worker: int, compute) -> dict:
    """What site `worker` sends for a request carrying request = {"round": id, "peers": {k: public key or None}}:
    its public key alone while the request does not name it (a new process: the key is made where the data live and
    never leaves), or some peer's key is unknown; else `compute()` masked for the round. A round id is answered once
    (a reused one would reveal the difference of two answers), and only in rounds of at least MIN_SITES sites."""
    state = _SITES.get(lm)
    if state is None:
        state = _SITES[lm] = {"key": private_key(), "rounds": set()}
    own, peers = public_bytes(state["key"]), dict(request["peers"])
    if peers.get(worker) != own or any(v is None for v in peers.values()):
        return {KEY_ANSWER: own}
    round_id = bytes(request["round"])
    if len(peers) < MIN_SITES:
        raise ValueError(f"site {worker} refuses a secure-aggregation round of {len(peers)} sites: with fewer than "
                         f"{MIN_SITES} the sum reveals the other sites' statistics")
    if round_id in state["rounds"]:
        raise ValueError(f"site {worker} refuses to answer secure-aggregation round {round_id.hex()} twice: two "
                         "answers under the same masks would reveal their difference")
    state["rounds"].add(round_id)
    return masked_message(compute(), state["key"], worker, peers, round_id)
