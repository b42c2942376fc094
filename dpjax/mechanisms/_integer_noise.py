r"""Exact integer noise from random 32-bit words (Canonne, Kamath, Steinke 2020, Algorithms 1–3).

Vectorised ``lax.while_loop`` rounds run the CKS20 samplers as a state machine, one step per
round for every unfinished coordinate (in levels of shrinking width, see
:func:`integer_noise`), with unsigned 32-bit integer arithmetic only (no floats decide any
outcome; JAX's 64-bit mode is not needed):

* **Bern(a/M)** for integers 0 ≤ a ≤ M ≤ 2³¹: a random word w is kept when
  w < 2³² − (2³² mod M) and then the result is [w mod M < a]; a word in the excess zone is
  discarded and the step repeats with the next word (exact: given acceptance, w mod M is uniform
  on {0, …, M − 1}).
* **Bern(exp(−a/M))**, a ≤ M (CKS Algorithm 1): K = 1, 2, … while Bern(a/M)·Bern(1/K) = 1;
  the result is [K odd]. Bern(exp(−1)) is the case a = M.
* **discrete Laplace** with P[Y = y] ∝ exp(−|y|·S/T) (CKS Algorithm 2): U uniform on
  {0, …, T − 1}, restart unless Bern(exp(−U/T)); V = number of Bern(exp(−1)) successes before
  the first failure; |Y| = ⌊(U + T·V)/S⌋ (kept as quotient and remainder, so no product
  overflows); a sign bit, restarting on "negative zero".
* **discrete Gaussian** N_ℤ(0, σ²), σ² = num/den (CKS Algorithm 3): a discrete Laplace proposal
  of scale t = σ²/m for an integer m ≥ 1, accepted with probability exp(−γ),
  γ = (|Y| − m)²/(2σ²) = d²·den/P with d = ||Y| − m| and P = 2·num, i.e. ⌊γ⌋ Bern(exp(−1))
  coins and one Bern(exp(−(γ − ⌊γ⌋))). ⌊γ⌋ and the remainder d²·den mod P are computed exactly
  (see :func:`_split_gamma`).

The loop runs until every coordinate is done: its number of rounds depends on the random words
only (never on the data), and is the timing channel CKS §5 discusses (it reveals how many
proposals were rejected, which is independent of the input).

Every state variable stays below 2³² by construction (the bounds are checked on the host by the
callers; the Alg. 1 counter K grows by one per round, so it cannot wrap within 2³² rounds):
|Y| saturates at ``cap``. For the discrete Laplace, only min(|Y|, cap) is ever used
(the release is clamped), so saturation is exact post-processing. For the discrete Gaussian a
proposal whose float32 estimate of γ exceeds 2²⁰ (then ⌊γ⌋ ≥ 2¹⁹; certainly the case when |Y|
saturates) is given 2³¹ coins instead of ⌊γ⌋: its acceptance needs ≥ 2¹⁹ consecutive
Bern(exp(−1)) successes either way, so the two laws differ only on runs that make such a
streak, an event of probability ≤ E[proposals]·e^{−2¹⁹} (< 2^{−700 000}; see
:data:`GAUSSIAN_TAIL_LOG2_BOUND`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["LaplaceProposal", "GaussianAcceptance", "integer_noise"]

_U32 = jnp.uint32
_ALL_ONES = 0xFFFFFFFF
_Q_EXACT = 2**20  # float estimates of ⌊γ⌋ above this saturate (true ⌊γ⌋ ≥ 2^19 then)
_Q_SATURATED = 2**31  # coins charged to a saturated proposal
#: log2 of the bound on the total-variation distance between the discrete Gaussian the code
#: samples and N_ℤ(0, σ²): e^{−2^19} per proposal, times ≤ 2^10 expected proposals (at σ ≥ 1
#: a proposal is accepted with probability ≥ 0.64, so fewer than 2 are made on average).
GAUSSIAN_TAIL_LOG2_BOUND = -(2**19) / math.log(2.0) + 10.0

_SHRINK = 8  # each level of the loop runs until ≤ 1/8 of its coordinates are left
_MIN_WIDTH = 4096  # narrower levels would cost more compile time than they save

_PHASE_U, _PHASE_D, _PHASE_V, _PHASE_COIN, _PHASE_FRAC, _PHASE_DONE = range(6)


@dataclasses.dataclass(frozen=True)
class LaplaceProposal:
    """CKS Algorithm 2 with integers T (scale numerator) and S: P[Y = y] ∝ exp(−|y|·S/T).

    Attributes:
        t: T, 1 ≤ T ≤ 2³¹.
        s: S, 1 ≤ S ≤ 2³¹.
        cap: |Y| is reported as min(|Y|, cap), 1 ≤ cap ≤ 2³⁰.
    """

    t: int
    s: int
    cap: int

    def __post_init__(self) -> None:
        if not (1 <= self.t <= 2**31 and 1 <= self.s <= 2**31 and 1 <= self.cap <= 2**30):
            raise ValueError(f"integer noise parameters out of range: {self}")


@dataclasses.dataclass(frozen=True)
class GaussianAcceptance:
    """CKS Algorithm 3's acceptance exp(−(|Y| − m)²·den/P) for σ² = num/den, P = 2·num.

    Attributes:
        m: the integer σ²/t (t the proposal's scale), 1 ≤ m ≤ 2³⁰.
        den: σ²'s denominator, ≥ 1.
        p: P = 2·num, 2 ≤ P ≤ 2²⁹ (so that 3P < 2³¹ in :func:`_split_gamma`).
    """

    m: int
    den: int
    p: int

    def __post_init__(self) -> None:
        if not (1 <= self.m <= 2**30 and 1 <= self.den < 2**32 and 2 <= self.p <= 2**29):
            raise ValueError(f"discrete Gaussian parameters out of range: {self}")


def _u32(x: int) -> jax.Array:
    return jnp.asarray(x, _U32)


def _bernoulli(word: jax.Array, a: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(usable, bit): bit = Bern(a/m) from one word when usable (m ≤ 2³¹, a ≤ m)."""
    excess = (_u32(0) - m) % m  # 2^32 mod m
    usable = word <= _u32(_ALL_ONES) - excess
    return usable, (word % m) < a


def _split_gamma(magnitude: jax.Array, accept: GaussianAcceptance, cap: int):
    """(⌊γ⌋, γ·P mod P) for γ = d²·den/P, d = |magnitude − m|; ⌊γ⌋ saturates at 2³¹.

    A float32 estimate q̂ of d²·den/P has relative error ≤ 5·2^{−24} (five correctly rounded
    operations: the conversion of d, the square, the constant den/P, the product). When
    q̂ ≤ 2^20 the true quotient q satisfies |q − ⌊q̂⌋| ≤ 1, and the residue d²·den − ⌊q̂⌋·P,
    computed with wrapping 32-bit arithmetic (exact modulo 2³²) and read as a signed integer,
    lies in (−2P, 3P) ⊂ (−2³¹, 2³¹), so one or two corrections give q and the remainder
    exactly. When q̂ > 2^20, q ≥ 2^19 and the proposal gets 2³¹ coins.
    """
    m = _u32(accept.m)
    d = jnp.where(magnitude >= m, magnitude - m, m - magnitude)
    df = d.astype(jnp.float32)
    estimate = (df * df) * jnp.asarray(accept.den / accept.p, jnp.float32)
    saturated = (estimate > _Q_EXACT) | (magnitude >= _u32(cap))
    q = jnp.floor(jnp.minimum(estimate, float(_Q_EXACT))).astype(_U32)
    p = _u32(accept.p)
    residue = lax.bitcast_convert_type(d * d * _u32(accept.den % 2**32) - q * p, jnp.int32)
    pi = jnp.asarray(accept.p, jnp.int32)
    for _ in range(2):
        low = residue < 0
        q = jnp.where(low, q - _u32(1), q)
        residue = jnp.where(low, residue + pi, residue)
        high = residue >= pi
        q = jnp.where(high, q + _u32(1), q)
        residue = jnp.where(high, residue - pi, residue)
    q = jnp.where(saturated, _u32(_Q_SATURATED), q)
    return q, lax.bitcast_convert_type(residue, _U32)


def _step(state, words, proposal: LaplaceProposal, accept: GaussianAcceptance | None):
    """One round of the state machine for every coordinate (one or two words each)."""
    phase, k, u, y, rem, sign, q, r = state
    w1, w2 = words
    one, zero = _u32(1), _u32(0)
    t, s = _u32(proposal.t), _u32(proposal.s)
    odd = (k & one) == one

    # U: a uniform on {0, …, T − 1}
    ok_u, bit_u = _bernoulli(w1, t, t)  # usable word; the value itself is w1 mod T
    # Alg. 1 steps: Bern(a/M) from w1 (D: U/T, FRAC: r/P), Bern(1/K) from w2
    ok_k, bit_k = _bernoulli(w2, one, k)
    num = jnp.where(phase == _PHASE_FRAC, r, u)
    den = t if accept is None else jnp.where(phase == _PHASE_FRAC, _u32(accept.p), t)
    ok_a, bit_a = _bernoulli(w1, num, den)
    two_words = (phase == _PHASE_D) | (phase == _PHASE_FRAC)
    usable = jnp.where(phase == _PHASE_U, ok_u, jnp.where(two_words, ok_a & ok_k, ok_k))
    step = jnp.where(two_words, bit_a & bit_k, bit_k)  # the Alg. 1 draw A
    k_next = jnp.where(step, k + one, one)
    done_alg1 = ~step  # A = 0: the Bernoulli(exp(−·)) outcome is [K odd]

    new = dict(phase=phase, k=k, u=u, y=y, rem=rem, sign=sign, q=q, r=r)
    restart = dict(phase=jnp.full_like(phase, _PHASE_U), k=jnp.ones_like(k))

    def put(cond, **fields):
        for name, value in fields.items():
            new[name] = jnp.where(cond, value, new[name])

    live = usable & (phase != _PHASE_DONE)
    in_ = {p: live & (phase == p) for p in range(5)}
    # U → D
    put(in_[_PHASE_U], phase=jnp.full_like(phase, _PHASE_D), k=jnp.ones_like(k), u=w1 % t)
    # D: Bern(exp(−U/T)); success → V with |Y| = ⌊U/S⌋ so far, failure → restart
    put(in_[_PHASE_D], k=k_next)
    d_ok = in_[_PHASE_D] & done_alg1 & odd
    put(d_ok, phase=jnp.full_like(phase, _PHASE_V), y=u // s, rem=u % s)
    put(in_[_PHASE_D] & done_alg1 & ~odd, **restart)
    # V: Bern(exp(−1)) coins; each success adds T to U + T·V (quotient and remainder by S)
    put(in_[_PHASE_V], k=k_next)
    v_more = in_[_PHASE_V] & done_alg1 & odd
    rem_v = rem + t % s
    carry = rem_v >= s
    y_v = jnp.minimum(y + t // s + carry.astype(_U32), _u32(proposal.cap))
    put(v_more, y=y_v, rem=jnp.where(carry, rem_v - s, rem_v))
    v_end = in_[_PHASE_V] & done_alg1 & ~odd
    negative = (w1 >> 31) == one  # an independent bit: w1 is unused by the V phase
    minus_zero = v_end & negative & (y == zero)
    put(minus_zero, **restart)
    proposed = v_end & ~minus_zero
    y_capped = jnp.minimum(y, _u32(proposal.cap))
    if accept is None:
        put(proposed, phase=jnp.full_like(phase, _PHASE_DONE), y=y_capped, sign=negative)
    else:
        q_new, r_new = _split_gamma(y_capped, accept, proposal.cap)
        nxt = jnp.where(q_new > zero, _PHASE_COIN, _PHASE_FRAC).astype(phase.dtype)
        put(proposed, phase=nxt, k=jnp.ones_like(k), y=y_capped, sign=negative, q=q_new, r=r_new)
        # COIN: ⌊γ⌋ Bern(exp(−1)) coins, all must succeed
        put(in_[_PHASE_COIN], k=k_next)
        coin_ok = in_[_PHASE_COIN] & done_alg1 & odd
        q_left = q - one
        put(coin_ok, q=q_left, k=jnp.ones_like(k))
        put(coin_ok & (q_left == zero), phase=jnp.full_like(phase, _PHASE_FRAC))
        put(in_[_PHASE_COIN] & done_alg1 & ~odd, **restart)
        # FRAC: Bern(exp(−r/P)); success → accept the proposal, failure → restart
        put(in_[_PHASE_FRAC], k=k_next)
        put(in_[_PHASE_FRAC] & done_alg1 & odd, phase=jnp.full_like(phase, _PHASE_DONE))
        put(in_[_PHASE_FRAC] & done_alg1 & ~odd, **restart)
    return tuple(new[n] for n in ("phase", "k", "u", "y", "rem", "sign", "q", "r"))


@functools.partial(jax.jit, static_argnames=("shape", "proposal", "accept"))
def integer_noise(
    key: jax.Array,
    shape: tuple[int, ...],
    proposal: LaplaceProposal,
    accept: GaussianAcceptance | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Exact discrete Laplace (``accept=None``) or discrete Gaussian noise.

    Args:
        key: a JAX PRNG key (one 2-word draw per coordinate and round, from fold_in(key, round)).
        shape: the noise shape (a tuple; static, like ``proposal`` and ``accept``: the
            compiled loop is cached per configuration, so eager calls do not recompile).
        proposal: the discrete Laplace parameters (the proposal, for the Gaussian).
        accept: the discrete Gaussian acceptance, or None for discrete Laplace noise.

    Returns:
        (noise, rounds): int32 noise with |noise| ≤ ``proposal.cap``, and the number of rounds
        the loop ran (random; independent of any data).

    The rounds run in levels: the first on every coordinate until at most 1/8 are unfinished,
    then those (gathered by ``jnp.nonzero``, a choice that depends on past random words only)
    on an array 8× narrower, and so on while ≥ 4096 coordinates, the last to the end. Every
    round draws fresh words, so each coordinate's steps use i.i.d. words whatever slot it
    occupies: the law is unchanged, and the work is ≈ Σ_r (coordinates left at round r)
    instead of (rounds of the slowest coordinate) × size.
    """
    size = math.prod(shape)
    noise = jnp.zeros((size,), jnp.int32)
    slots = jnp.arange(size, dtype=jnp.int32)  # slot → coordinate (size = padding)
    state = _initial_state(size)
    rounds = jnp.zeros((), jnp.int32)
    width = size
    while True:  # levels of a static schedule: widths size, size/8, size/64, … (≥ 4096)
        target = width // _SHRINK if width >= _SHRINK * _MIN_WIDTH else 0

        def cond(carry, target=target):
            state, _ = carry
            return jnp.sum(state[0] != _PHASE_DONE) > target

        def body(carry, width=width):
            state, rounds = carry
            words = jax.random.bits(jax.random.fold_in(key, rounds), (2, width), _U32)
            return _step(state, words, proposal, accept), rounds + 1

        state, rounds = lax.while_loop(cond, body, (state, rounds))
        done = state[0] == _PHASE_DONE
        noise = noise.at[jnp.where(done, slots, size)].set(_signed(state), mode="drop")
        if target == 0:
            break
        # carry the ≤ target unfinished coordinates into a narrower state (padding: done)
        (keep,) = jnp.nonzero(~done, size=target, fill_value=width)
        fills = (_PHASE_DONE, 1, 0, 0, 0, False, 0, 0)
        state = tuple(
            jnp.take(a, keep, mode="fill", fill_value=f) for a, f in zip(state, fills, strict=True)
        )
        slots = jnp.take(slots, keep, mode="fill", fill_value=size)
        width = target
    return noise.reshape(shape), rounds


def _initial_state(size: int) -> tuple[jax.Array, ...]:
    zeros = jnp.zeros((size,), _U32)
    return (
        jnp.full((size,), _PHASE_U, jnp.int32),
        jnp.ones((size,), _U32),
        zeros,
        zeros,
        zeros,
        jnp.zeros((size,), bool),
        zeros,
        zeros,
    )


def _signed(state: tuple[jax.Array, ...]) -> jax.Array:
    magnitude = state[3].astype(jnp.int32)
    return jnp.where(state[5], -magnitude, magnitude)
