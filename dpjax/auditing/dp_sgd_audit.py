r"""Auditing whole DP-SGD runs of :func:`dpjax.make_private`: gradient canaries, white box.

The canary construction of Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini, Terzis 2023
("Tight auditing of differentially private machine learning", USENIX Security): every canary is a
record whose clipped gradient is a Dirac direction of norm C on a parameter no other record
touches. :func:`add_gradient_canaries` wraps a user's loss, parameters and data so that

* the parameters become ``{"model": params, "canary": zeros(m)}``;
* rows ``0 … m−1`` of the data are the canaries: canary j, when included, has the loss
  ``2C · θ_canary[j]`` (gradient 2C·e_j, clipped to exactly C·e_j) and no model loss; when
  excluded it is a zero row (the "zero-out" neighbour that ``make_private`` accounts: a row that
  contributes 0). Canary 0 sits at index 0, the index padding slots of the Poisson sampler
  hold, so a sampler whose mask is forgotten leaks it;
* the optimizer is the user's on ``"model"`` and plain SGD with rate 1 on ``"canary"``
  (post-processing of the noisy sum, per coordinate), so the white-box adversary reads the noisy
  clipped sum on every canary coordinate from consecutive parameters.

On canary coordinate j the adversary sees, at every step and in units of C,
x_t = b_t + σ·Z_t with b_t ~ Bernoulli(q) when the canary is in, b_t = 0 when it is out.
:func:`gradient_canary_llr` is the log-likelihood ratio of that pair, summed over steps — the
Neyman–Pearson optimal statistic for the white-box game.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax import _validate
from dpjax.auditing.estimators import (
    EpsilonLowerBound,
    guesses_from_scores,
    one_run_epsilon_lower_bound,
    one_run_max_epsilon,
)
from dpjax.dp_sgd.adaptive_clip import AdaptiveClipState
from dpjax.dp_sgd.transforms import NoiseState

__all__ = [
    "CanaryRun",
    "RunAudit",
    "audit_run",
    "add_gradient_canaries",
    "canary_optimizer",
    "canary_updates",
    "canary_updates_many",
    "gradient_canary_llr",
    "states_for_keys",
    "with_noise_key",
]

#: pre-clip size of a canary gradient, in units of C (clipped to exactly C by the clip factor)
CANARY_GRADIENT_SCALE = 2.0


def gradient_canary_llr(x, *, noise_multiplier: float, sampling_rate: float) -> np.ndarray:
    r"""Log-likelihood ratio of Poisson-sampled Dirac-canary observations, summed over steps.

    .. math::
        \Lambda(x_{1:T}) = \sum_t \log\Big((1-q) + q\,\exp\Big(\frac{2x_t - 1}{2\sigma^2}\Big)\Big)

    the log-ratio of (1−q)·N(0, σ²) + q·N(1, σ²) (canary in, sampled with probability q) to
    N(0, σ²) (canary out), for observations x_t in units of C.

    Args:
        x: array ``[..., T]`` of per-step canary observations (in units of C).
        noise_multiplier: σ > 0 the audited run claims.
        sampling_rate: q in (0, 1] the audited run claims.

    Returns:
        Array ``[...]``: large = evidence that the canary was included.

    Formal guarantees:
        With independent steps, this is the likelihood-ratio statistic of the two product laws,
        hence the most powerful test at every level (Neyman–Pearson lemma); Nasr et al. 2023
        use it for their white-box DP-SGD audit.

    Example:
        >>> import numpy as np
        >>> float(gradient_canary_llr(np.array([0.5]), noise_multiplier=1.0, sampling_rate=1.0))
        0.0
    """
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    q = _validate.in_range("sampling_rate", sampling_rate, 0.0, 1.0, low_inclusive=False,
                           high_inclusive=True)  # fmt: skip
    x = np.asarray(x, dtype=np.float64)
    shift = np.log(q) + (2.0 * x - 1.0) / (2.0 * sigma**2)
    stay = np.log1p(-q) if q < 1.0 else -np.inf
    return np.sum(np.logaddexp(stay, shift), axis=-1)


def _wants_rng(loss_fn: Callable) -> bool:
    try:
        return "rng" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False


def add_gradient_canaries(
    loss_fn: Callable,
    params: Any,
    data: Any,
    included,
    *,
    l2_clip_norm: float,
    input_examples: Any = None,
    input_included=None,
) -> tuple[Callable, Any, Any]:
    """Wrap a per-example loss, its parameters and data with m Dirac gradient canaries.

    Optionally also with input-space canaries (ordinary examples of the user's model, e.g.
    mislabelled or out-of-distribution points, audited from the final model only).

    Args:
        loss_fn: ``loss_fn(params, example)`` or ``loss_fn(params, example, rng)``, as for
            :func:`dpjax.make_private`.
        params: the model parameters (any pytree).
        data: the data set (a pytree of arrays with leading axis n ≥ 1).
        included: bool array ``[m]``: which gradient canaries are in the data set.
        l2_clip_norm: C of the audited run.
        input_examples: optional pytree like ``data`` with leading axis m_x: input canaries.
        input_included: bool array ``[m_x]``: which input canaries are in (required with
            ``input_examples``).

    Returns:
        ``(loss, params, data)`` for :func:`dpjax.make_private` with ``dataset_size =
        m + m_x + n``: gradient canary j is row j, input canary i is row m + i (an excluded
        canary is a zero row), the user's rows follow. ``loss`` does not depend on
        ``included``: runs on neighbouring data sets can share one :class:`PrivateTraining`.
    """
    inc = np.asarray(included, dtype=bool).ravel()
    m = inc.size
    if m < 1:
        _validate.fail("included", inc.shape, "a bool array of at least one canary")
    clip = _validate.positive("l2_clip_norm", l2_clip_norm)
    leaves = jax.tree.leaves(data)
    if not leaves or any(jnp.ndim(x) < 1 for x in leaves):
        _validate.fail("data", data, "a pytree of arrays with leading axis n >= 1")
    n = jnp.shape(leaves[0])[0]
    if input_examples is None:
        input_examples = jax.tree.map(lambda x: jnp.asarray(x)[:0], data)
        input_included = np.zeros(0, bool)
    x_inc = np.asarray(input_included, dtype=bool).ravel()
    m_x = jnp.shape(jax.tree.leaves(input_examples)[0])[0]
    if x_inc.size != m_x:
        _validate.fail("input_included", x_inc.shape, f"a bool array of shape ({m_x},)")
    floats = [x.dtype for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
    dtype = floats[0] if floats else jnp.dtype(jnp.float32)
    first = jax.tree.map(lambda x: jnp.repeat(jnp.asarray(x)[:1], m, axis=0), data)
    gradient = np.diag(inc.astype(np.float64) * CANARY_GRADIENT_SCALE * clip)
    rows = lambda a, b, c: jnp.concatenate([a, jnp.asarray(b, a.dtype), c])  # noqa: E731
    wrapped_data = {
        "example": jax.tree.map(rows, first, input_examples, data),
        "canary": jnp.concatenate([jnp.asarray(gradient, dtype), jnp.zeros((m_x + n, m), dtype)]),
        "is_canary": jnp.concatenate(
            [jnp.ones(m, bool), jnp.asarray(~x_inc), jnp.zeros(n, bool)]
        ),  # no model loss: gradient canaries and excluded input canaries (zero rows)
    }
    wrapped_params = {"model": params, "canary": jnp.zeros(m, dtype)}

    def canary_part(p, ex):
        return jnp.dot(ex["canary"], p["canary"])

    def model_part(value, ex):
        return jnp.where(ex["is_canary"], jnp.zeros((), value.dtype), value)

    if _wants_rng(loss_fn):

        def loss(p, ex, rng):
            return model_part(loss_fn(p["model"], ex["example"], rng=rng), ex) + canary_part(p, ex)

    else:

        def loss(p, ex):
            return model_part(loss_fn(p["model"], ex["example"]), ex) + canary_part(p, ex)

    return loss, wrapped_params, wrapped_data


def canary_optimizer(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optimizer`` on ``params["model"]``, SGD at rate 1 on ``params["canary"]``."""

    def labels(p):
        return {"model": jax.tree.map(lambda _: "model", p["model"]), "canary": "canary"}

    return optax.multi_transform({"model": optimizer, "canary": optax.sgd(1.0)}, labels)


def with_noise_key(opt_state: Any, key_data: jax.Array) -> Any:
    """``opt_state`` with the key data of every :class:`~dpjax.dp_sgd.NoiseState` replaced."""

    def rekey(leaf):
        if isinstance(leaf, NoiseState):
            return leaf._replace(key=jnp.asarray(key_data, leaf.key.dtype))
        return leaf

    return jax.tree.map(rekey, opt_state, is_leaf=lambda x: isinstance(x, NoiseState))


def states_for_keys(state: Any, keys: jax.Array) -> Any:
    """Stack of :class:`~dpjax.dp_sgd.PrivateState` s, one per key, as ``make_private(key=k)``
    would initialise them (``noise_key, train_key = split(k)``), from one ``init`` state.

    Args:
        state: the state of ``private.init(params)``.
        keys: ``[R]`` typed PRNG keys (one independent run each).

    Returns:
        The state with a leading axis R on every leaf (for ``jax.vmap``).
    """

    def one(k):
        noise_key, train_key = jax.random.split(k)
        opt = _rekeyed_opt_state(state.opt_state, noise_key)
        return state._replace(key=jax.random.key_data(train_key), opt_state=opt)

    return jax.vmap(one)(keys)


def _rekeyed_opt_state(opt_state: Any, noise_key: jax.Array) -> Any:
    """``opt_state`` with the noise keys ``make_private`` derives from ``noise_key``.

    Adaptive clipping splits ``noise_key`` into the gradient noise's key and the count noise's
    key (:class:`~dpjax.dp_sgd.adaptive_clip.AdaptiveUpdate`): giving both the same key, as
    :func:`with_noise_key` would, makes the two noises equal and audits another mechanism.
    """
    if isinstance(opt_state, tuple) and opt_state and isinstance(opt_state[0], AdaptiveClipState):
        grad_key, count_key = jax.random.split(noise_key)
        clip, noise_state, rest = opt_state
        count = with_noise_key(clip.count_noise, jax.random.key_data(count_key))
        noise_state = with_noise_key(noise_state, jax.random.key_data(grad_key))
        return (clip._replace(count_noise=count), noise_state, rest)
    return with_noise_key(opt_state, jax.random.key_data(noise_key))


class CanaryRun:
    """What a white-box adversary reads from a canaried run: per-step canary observations."""

    def __init__(self, observations: np.ndarray, final_params: Any):
        #: ``[R, T, m]`` observations x_t (units of C) of every canary at every step
        self.observations = observations
        #: the final parameters θ_T of every run (leading axis R)
        self.final_params = final_params


def canary_updates(
    private: Any, params: Any, data: Any, keys: jax.Array, *, steps: int | None = None,
    chunk: int = 8192,
) -> CanaryRun:  # fmt: skip
    """Run ``private.step`` (the real DP-SGD step) R times, vmapped over keys; read the canaries.

    Args:
        private: a :class:`~dpjax.PrivateTraining` built from the outputs of
            :func:`add_gradient_canaries` with :func:`canary_optimizer`; its ``init`` is called
            once here (one object per audit).
        params: the wrapped parameters.
        data: the wrapped data.
        keys: ``[R]`` PRNG keys, one run each.
        steps: number of steps (default: the plan's T).
        chunk: runs per vmapped batch (memory).

    Returns:
        A :class:`CanaryRun`: x_t = −Δθ_canary·(q·n)/C per step and canary, and θ_T.
    """
    return canary_updates_many(private, params, [data], [keys], steps=steps, chunk=chunk)[0]


def canary_updates_many(
    private: Any, params: Any, datasets: list, keys: list, *, steps: int | None = None,
    chunk: int = 8192,
) -> list[CanaryRun]:  # fmt: skip
    """:func:`canary_updates` on several neighbouring data sets (same shapes), ONE compiled step.

    ``private.init`` is called once; the runs on ``datasets[i]`` start from states built from
    ``keys[i]`` (all keys distinct, so the runs are independent).
    """
    steps = private.steps if steps is None else _validate.positive_int("steps", steps)
    scale = private.expected_batch_size / private.l2_clip_norm
    state = private.init(params)

    def one_run(s, data):
        def body(carry, _):
            p, st = carry
            p_next, st_next, _ = private.step(p, st, data)
            x = -(p_next["canary"] - p["canary"]) * scale
            return (p_next, st_next), x

        (p_final, _), xs = jax.lax.scan(body, (params, s), None, length=steps)
        return xs, p_final

    run = jax.jit(jax.vmap(one_run, in_axes=(0, None)))
    results = []
    for data, run_keys in zip(datasets, keys, strict=True):
        states = states_for_keys(state, run_keys)
        outs = []
        for start in range(0, run_keys.shape[0], chunk):
            sl = jax.tree.map(lambda x, s=start: x[s : s + chunk], states)
            outs.append(jax.device_get(run(sl, data)))
        xs = np.concatenate([np.asarray(o[0], np.float64) for o in outs])
        final = jax.tree.map(lambda *a: np.concatenate(a), *[o[1] for o in outs])
        results.append(CanaryRun(xs, final))
    return results


# ----------------------------------------------------------------------------- one-run audit


@dataclasses.dataclass(frozen=True)
class RunAudit:
    """The result of :func:`audit_run`: an empirical ε lower bound next to the claimed ε.

    Attributes:
        claimed_epsilon: ε that ``make_private`` accounts for the run (at ``delta``).
        delta: δ of the claim and of the bounds.
        white_box: one-run bound from the gradient canaries, every update observed.
        black_box: one-run bound from the input canaries, final model only (None if none).
        params: the trained model parameters (the canaries' parameters removed).
        canaries: m, the number of gradient canaries.
        noise_multiplier: σ of the run; sampling_rate: q; steps: T.
        max_epsilon: the largest white-box ε_LB this configuration (m, guesses, δ,
            confidence) can report, every guess correct (:func:`one_run_max_epsilon`).
    """

    claimed_epsilon: float
    delta: float
    white_box: EpsilonLowerBound
    black_box: EpsilonLowerBound | None
    params: Any
    canaries: int
    noise_multiplier: float
    sampling_rate: float
    steps: int
    max_epsilon: float = float("inf")

    @property
    def ratio(self) -> float:
        """White-box ε_LB / claimed ε."""
        return self.white_box.epsilon / self.claimed_epsilon

    @property
    def can_refute(self) -> bool:
        """Whether this audit could refute the claim at all (``max_epsilon`` > claimed ε).

        When False, ε_LB ≤ claimed ε holds whatever the run does: the audit is not a test of
        the claim (a σ/2 bug at a claimed ε of 8.3 passes every time with the defaults).
        """
        return self.max_epsilon > self.claimed_epsilon


def audit_run(
    loss_fn: Callable,
    params: Any,
    data: Any,
    *,
    key: jax.Array,
    optimizer: optax.GradientTransformation,
    l2_clip_norm: float,
    batch_size: int,
    delta: float,
    num_canaries: int = 1000,
    guesses: int | None = None,
    input_canaries: Any = None,
    input_score: Callable[[Any, Any], jax.Array] | None = None,
    confidence: float = 0.95,
    **make_private_kwargs: Any,
) -> RunAudit:
    r"""Audit ONE ``make_private`` training run with canaries (Steinke, Nasr, Jagielski 2023).

    ``num_canaries`` Dirac gradient canaries (and optionally input-space canaries), each
    included independently with probability ½, are added to ``data``; ONE run of
    :func:`dpjax.make_private` (your loss, optimizer, C, batch size, σ or target ε, steps or
    epochs) trains on it. A white-box adversary scores every gradient canary by the
    likelihood ratio of its observed noisy updates (:func:`gradient_canary_llr`), guesses IN
    for the ``guesses`` highest scores and OUT for the ``guesses`` lowest, and the number of
    correct guesses gives ε_LB (:func:`~dpjax.auditing.one_run_epsilon_lower_bound`). Input
    canaries are scored by ``input_score(final_model_params, example)`` (black box).

    Args:
        loss_fn: the loss of ONE example, as for :func:`dpjax.make_private`.
        params: initial model parameters.
        data: the training data (pytree, leading axis n).
        key: PRNG key of the audit (canary inclusion and the run's key).
        optimizer: the optax optimizer of the model (the canary parameters get SGD).
        l2_clip_norm: C.
        batch_size: expected batch size over the n + m (+ m_x) rows.
        delta: δ of the claim.
        num_canaries: m ≥ 1 gradient canaries.
        guesses: IN and OUT guesses each (default max(1, m // 20)); fixed before the run.
        input_canaries: optional pytree of m_x input-space examples (leading axis m_x).
        input_score: ``input_score(model_params, example) -> scalar``, large = the example was
            trained on (e.g. minus its loss); required with ``input_canaries``.
        confidence: confidence of each bound.
        **make_private_kwargs: the rest of :func:`dpjax.make_private` (``steps`` or
            ``epochs``, ``noise_multiplier`` or ``target_epsilon``, ``clipping``, ...).

    Returns:
        A :class:`RunAudit` (ε_LB next to the claimed ε, the trained parameters).

    Raises:
        ValueError: a bad argument (named, with its valid range).

    Formal guarantees:
        Steinke, Nasr, Jagielski 2023 ("Privacy auditing with one (1) training run"),
        Theorem 3.1: if the run is (ε, δ)-DP under add/remove of one record, the bound exceeds
        ε with probability ≤ 1 − confidence. An excluded canary is a row that contributes 0,
        the zero-out neighbour make_private accounts. ε_LB ≤ ε is evidence, not proof, of a
        correct implementation; ε_LB > claimed ε refutes the claim.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> x = jax.random.normal(jax.random.key(1), (200, 3))
        >>> loss_fn = lambda w, ex: 0.5 * (ex["x"] @ w - ex["y"]) ** 2
        >>> result = audit_run(loss_fn, jnp.zeros(3), {"x": x, "y": x[:, 0]},
        ...     key=jax.random.key(0), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
        ...     batch_size=150, delta=1e-5, num_canaries=100, steps=10, noise_multiplier=1.0,
        ...     accounting="rdp")
        >>> result.white_box.epsilon <= result.claimed_epsilon
        True
    """
    from dpjax.dp_sgd.training.factory import make_private

    m = _validate.positive_int("num_canaries", num_canaries)
    k = max(1, m // 20) if guesses is None else _validate.positive_int("guesses", guesses)
    if 2 * k > m:
        _validate.fail("guesses", guesses, f"in [1, num_canaries/2 = {m // 2}]")
    if (input_canaries is None) != (input_score is None):
        _validate.fail("input_score", input_score, "given exactly when input_canaries is")
    # Every argument is checked before the (long) training run.
    delta = _validate.delta("delta", delta)
    confidence = _validate.in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False)
    if confidence >= 1.0:
        _validate.fail("confidence", confidence, "in (0, 1)")
    sigma = make_private_kwargs.get("noise_multiplier")
    if sigma is not None:
        _validate.positive("noise_multiplier", sigma)
    k_incl, k_input, k_run = jax.random.split(key, 3)
    included = np.asarray(jax.random.bernoulli(k_incl, 0.5, (m,)))
    m_x, x_included = 0, None
    if input_canaries is not None:
        m_x = jnp.shape(jax.tree.leaves(input_canaries)[0])[0]
        x_included = np.asarray(jax.random.bernoulli(k_input, 0.5, (m_x,)))
    loss, wrapped_params, wrapped_data = add_gradient_canaries(
        loss_fn, params, data, included, l2_clip_norm=l2_clip_norm,
        input_examples=input_canaries, input_included=x_included,
    )  # fmt: skip
    n_rows = jnp.shape(jax.tree.leaves(wrapped_data)[0])[0]
    private = make_private(
        loss, optimizer=canary_optimizer(optimizer), l2_clip_norm=l2_clip_norm,
        dataset_size=n_rows, batch_size=batch_size, delta=delta, key=k_run,
        **make_private_kwargs,
    )  # fmt: skip
    claimed = private.epsilon(private.steps)
    reachable = one_run_max_epsilon(m=m + m_x, guesses=2 * k, delta=delta, confidence=confidence)
    if reachable <= claimed:
        warnings.warn(
            f"this audit cannot refute the claimed epsilon {claimed:.3g}: with num_canaries="
            f"{m} and guesses={k} (+{k} OUT) at delta={delta:g} the one-run bound reaches at most "
            f"{reachable:.3g} even if every guess is right. Use more canaries and guesses "
            "(auditing.one_run_max_epsilon sizes them) or read the result as a smoke test, "
            "not a test of the claim (RunAudit.can_refute is False).",
            UserWarning,
            stacklevel=2,
        )
    run = canary_updates(private, wrapped_params, wrapped_data, k_run[None])
    scores = gradient_canary_llr(
        np.moveaxis(run.observations[0], 0, -1),
        noise_multiplier=private.noise_multiplier,
        sampling_rate=private.sampling_rate,
    )
    white = _one_run_bound(scores, included, k, m + m_x, delta, confidence)
    model = jax.tree.map(lambda a: a[0], run.final_params["model"])
    black = None
    if input_canaries is not None:
        s = jax.vmap(input_score, in_axes=(None, 0))(model, input_canaries)
        kx = max(1, m_x // 20) if guesses is None else min(k, m_x // 2)
        black = _one_run_bound(np.asarray(s), x_included, kx, m + m_x, delta, confidence)
    return RunAudit(
        claimed_epsilon=claimed,
        delta=delta,
        white_box=white,
        black_box=black,
        params=model,
        canaries=m,
        noise_multiplier=private.noise_multiplier,
        sampling_rate=private.sampling_rate,
        steps=private.steps,
        max_epsilon=reachable,
    )


def _one_run_bound(scores, truths, k: int, m: int, delta: float, confidence: float):
    guesses = guesses_from_scores(scores, k_in=k, k_out=k)
    return one_run_epsilon_lower_bound(guesses, truths, m=m, delta=delta, confidence=confidence)
