"""The cryptography of secure aggregation (:mod:`edgefl.privacy.secagg`): key agreement, the
authenticated device-to-device channel, the mask generator, Shamir's secret sharing and the
fixed-point ring. Everything here comes from the ``cryptography`` library (X25519, HKDF-SHA256,
ChaCha20, ChaCha20-Poly1305) or is plain modular arithmetic on Python integers.

- **Key agreement**: X25519; an agreed secret is never used directly, only through HKDF-SHA256
  with a label naming its use, the run and the round (:func:`derive`).
- **Mask generator**: ChaCha20 keyed by a derived 32-byte key, its key stream read as unsigned
  32-bit integers (:func:`prg`): the masks live in the ring Z/2³²Z.
- **Channel**: ChaCha20-Poly1305 keyed by the pair's agreed secret; the associated data names the
  run, round, sender and recipient, so the server that relays a ciphertext cannot pass it off as
  another pair's or another round's (:func:`seal`, :func:`open_sealed`).
- **Shamir**: polynomials of degree t-1 over GF(2⁵²¹ - 1) (a Mersenne prime, larger than every
  256-bit secret); share j is the polynomial at x = j.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from edgefl.errors import EdgeflError

#: The prime field of the secret shares: 2⁵²¹ - 1 (prime), so every 256-bit secret is an element.
PRIME = 2**521 - 1
#: Bytes of one field element (a share's value) on the wire.
SHARE_BYTES = 66
#: Bytes of a secret (an X25519 private key, a self-mask seed) and of a public key.
KEY_BYTES = 32
#: ChaCha20-Poly1305: nonce and tag bytes.
NONCE_BYTES, TAG_BYTES = 12, 16
#: Bits of the ring the masked vectors live in (Z/2^RING_BITS Z, carried as int32 on the wire).
RING_BITS = 32


class SecAggError(EdgeflError):
    """Secure aggregation cannot go on: a check failed (a device or the server misbehaved, or too
    few devices remain). The round fails; no sum is produced."""


# --- keys --------------------------------------------------------------------------------------


def new_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair: the private key and its 32-byte public key."""
    sk = X25519PrivateKey.generate()
    return sk, public_bytes(sk)


def public_bytes(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def agree(sk: X25519PrivateKey | bytes, peer_public: bytes) -> bytes:
    """The X25519 shared secret of a private key and a peer's 32-byte public key."""
    if isinstance(sk, bytes):
        sk = X25519PrivateKey.from_private_bytes(sk)
    try:
        return sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:  # a low-order point gives the all-zero secret: refused by the library
        raise SecAggError(f"key agreement failed: {e}") from None


def derive(secret: bytes, label: str, context: str) -> bytes:
    """A 32-byte key for one use (``label``) in one ``context`` (run and round), by HKDF-SHA256."""
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=None,
        info=f"edgefl-secagg|{label}|{context}".encode(),
    )
    return hkdf.derive(secret)


def commitment(seed: bytes, context: str) -> bytes:
    """A hash commitment to a 256-bit self-mask seed (SHA-256; hides a random seed, binds it)."""
    return hashlib.sha256(f"edgefl-secagg|seed|{context}|".encode() + seed).digest()


def public_of(sk: bytes) -> bytes:
    """The X25519 public key of a 32-byte private key."""
    return public_bytes(X25519PrivateKey.from_private_bytes(sk))


# --- the channel and the mask generator --------------------------------------------------------


def _aad(context: str, sender: str, recipient: str) -> bytes:
    return f"edgefl-secagg|share|{context}|{sender}|{recipient}".encode()


def seal(key: bytes, context: str, sender: str, recipient: str, plaintext: bytes) -> bytes:
    """nonce ‖ ChaCha20-Poly1305(plaintext), bound to the run, round, sender and recipient."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, _aad(context, sender, recipient))


def open_sealed(key: bytes, context: str, sender: str, recipient: str, sealed: bytes) -> bytes:
    """The plaintext of :func:`seal`'s output; SecAggError when it was not sealed by this pair
    for this run, round and direction, or was changed on the way."""
    try:
        return ChaCha20Poly1305(key).decrypt(
            bytes(sealed[:NONCE_BYTES]),
            bytes(sealed[NONCE_BYTES:]),
            _aad(context, sender, recipient),
        )
    except InvalidTag:
        raise SecAggError(
            f"the shares {sender} sent {recipient} fail authentication "
            "(forged, altered, or relayed under another name)"
        ) from None


def prg(key: bytes, length: int) -> np.ndarray:
    """``length`` pseudo-random elements of Z/2³²Z: ChaCha20's key stream under ``key``."""
    encryptor = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(encryptor.update(b"\0" * (4 * length)), dtype="<u4").astype(np.uint32)


# --- Shamir's secret sharing over GF(PRIME) ----------------------------------------------------


def share_secret(secret: bytes, xs: Sequence[int], threshold: int) -> dict[int, int]:
    """Shares of ``secret`` at the points ``xs`` (distinct, in 1..PRIME-1): any ``threshold`` of
    them give it back, fewer reveal nothing about it."""
    if not 1 <= threshold <= len(xs):
        raise SecAggError(f"a threshold of {threshold} for {len(xs)} shares")
    coefficients = [int.from_bytes(secret, "big")] + [
        secrets.randbelow(PRIME) for _ in range(threshold - 1)
    ]
    out = {}
    for x in xs:
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        out[x] = y
    return out


def lagrange_weights(xs: Sequence[int], at: int = 0) -> list[int]:
    """Weights λⱼ with f(at) = Σ λⱼ·f(xⱼ) for every polynomial of degree < len(xs)."""
    out = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * (at - xm) % PRIME
                den = den * (xj - xm) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return out


def combine(weights: Sequence[int], ys: Sequence[int]) -> int:
    return sum(w * y for w, y in zip(weights, ys, strict=True)) % PRIME


def to_secret(value: int) -> bytes | None:
    """A reconstructed field element as a 32-byte secret (None: out of range, so not a secret)."""
    return value.to_bytes(KEY_BYTES, "big") if 0 <= value < 2 ** (8 * KEY_BYTES) else None


def share_bytes(y: int) -> bytes:
    return y.to_bytes(SHARE_BYTES, "big")


def share_value(raw: bytes) -> int:
    y = int.from_bytes(raw, "big")
    if y >= PRIME:
        raise SecAggError("a share outside the field")
    return y


def recover(
    shares: Mapping[int, int],
    threshold: int,
    valid,
    *,
    tries: int = 64,
    weights_cache: dict | None = None,
) -> tuple[bytes, list[int]]:
    """The secret that ``shares`` (x → y) hold and passes ``valid`` (its check against what its
    owner committed to), and the points whose shares disagree with it (their holders lied).

    The first ``threshold`` shares are tried first; when they give a secret that fails the
    check, other subsets are tried (at most ``tries``, drawn at random). SecAggError when none
    gives a valid secret: the round cannot remove this mask, and must fail."""
    xs = sorted(shares)
    if len(xs) < threshold:
        raise SecAggError(f"{len(xs)} shares, {threshold} needed")
    cache = weights_cache if weights_cache is not None else {}
    rng = secrets.SystemRandom()
    subset = xs[:threshold]
    for attempt in range(tries):
        key = tuple(subset)
        if key not in cache:
            cache[key] = lagrange_weights(subset)
        secret = to_secret(combine(cache[key], [shares[x] for x in subset]))
        if secret is not None and valid(secret):
            if attempt == 0:  # the usual case: the shares not used are not looked at
                return secret, []
            return secret, _disagreeing(shares, subset, secret)
        if len(xs) == threshold:
            break
        subset = sorted(rng.sample(xs, threshold))
    raise SecAggError("no subset of the shares gives a secret that matches its owner's commitment")


def _disagreeing(shares: Mapping[int, int], subset: Sequence[int], secret: bytes) -> list[int]:
    """The points whose share is not on the polynomial through the (verified) ``subset``."""
    ys = [shares[x] for x in subset]
    bad = []
    for x in sorted(set(shares) - set(subset)):
        if combine(lagrange_weights(subset, x), ys) != shares[x]:
            bad.append(x)
    return bad
