"""``make_private``: DP-SGD in one call — σ, C, the batch and the accountant stated once.

Opacus' ``make_private`` for JAX: from the loss of ONE example, an optax optimizer, the clip norm,
the data set size, the expected batch size and the length of training, :func:`make_private`
checks every argument, fixes the schedule (:func:`poisson_schedule`), σ (given, or calibrated
for ``target_epsilon``) and the padded sampler's cap (truncation slack ≤ ``SLACK_FRACTION``·δ),
and returns a :class:`~dpjax.dp_sgd.PrivateTraining` (or, with ``user_ids``, a
:class:`~dpjax.dp_sgd.UserLevelTraining`)::

    sampler (Poisson, padded, cap sized for δ)  ->  gather  ->  clipped_grad (mask applied)  ->
    [k micro-batches, sums accumulated]  ->  N(0, (σC)²) once  ->  ÷ q·n  ->  optimizer
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dpjax import _validate
from dpjax._warnings import PrivacyLeakWarning
from dpjax.accounting.dp_sgd import calibrate_noise_multiplier, warn_if_delta_reveals_records
from dpjax.accounting.filters import PrivacyFilter
from dpjax.dp_sgd import adaptive_clip
from dpjax.dp_sgd.clipping import BACKENDS as CLIPPING_BACKENDS
from dpjax.dp_sgd.clipping import CLIP_RULES, DEFAULT_GAMMA, clipped_grad
from dpjax.dp_sgd.samplers import PoissonSampler, _binomial_cap, realised_sampling_rate
from dpjax.dp_sgd.training import inputs
from dpjax.dp_sgd.training.accounting import NOT_PRIVATE_EPSILON, SLACK_FRACTION, _epsilon_bound
from dpjax.dp_sgd.training.inputs import _check_key
from dpjax.dp_sgd.training.loop import PrivateTraining
from dpjax.events import PoissonSampledGaussianEvent

__all__ = ["ACCOUNTING_METHODS", "make_private", "poisson_schedule"]

ACCOUNTING_METHODS = ("pld", "rdp")


def poisson_schedule(dataset_size: int, batch_size: int, epochs: float) -> tuple[float, int]:
    """Sampling rate q and number of steps T of Poisson DP-SGD from epochs and batch size.

    q = b/n (each example joins a batch with probability q, so the EXPECTED batch size is b)
    and T = ⌈epochs · n/b⌉ = ⌈epochs/q⌉ (one epoch = n/b expected batches), computed exactly
    in rationals.

    Args:
        dataset_size: n ≥ 1.
        batch_size: the expected (logical) batch size b in [1, n].
        epochs: E > 0 passes over the data in expectation.

    Returns:
        ``(q, T)``.

    Example:
        >>> poisson_schedule(dataset_size=60_000, batch_size=256, epochs=3)
        (0.004266666666666667, 704)
    """
    n = _validate.positive_int("dataset_size", dataset_size)
    b = _validate.positive_int("batch_size", batch_size)
    if b > n:
        _validate.fail("batch_size", batch_size, f"in [1, dataset_size={n}]")
    epochs = _validate.positive("epochs", epochs)
    steps = math.ceil(Fraction(epochs) * n / b)
    return b / n, max(1, steps)


def _resolve_steps(n: int, batch_size: int, epochs: Any, steps: Any) -> int:
    if (epochs is None) == (steps is None):
        _validate.fail(
            "epochs",
            epochs,
            f"given, with steps=None (exactly one of epochs and steps; got steps={steps!r})",
        )
    if steps is not None:
        return _validate.positive_int("steps", steps)
    return poisson_schedule(n, batch_size, epochs)[1]


def _not_private(reason: str) -> None:
    warnings.warn(
        f"make_private: NOT PRIVATE — {reason}; epsilon(state) reports inf (a clip-only "
        "baseline for comparison, not a private run)",
        PrivacyLeakWarning,
        stacklevel=3,
    )


def _resolve_noise(
    noise_multiplier: Any,
    target_epsilon: Any,
    *,
    delta: float,
    q: float,
    steps: int,
    accounting: str,
) -> tuple[float, float]:
    """(σ, an upper bound on ε after ``steps`` at δ·(1 − SLACK_FRACTION); inf: not private).

    σ = 0 (clipping only) and σ so small that ε ≥ :data:`NOT_PRIVATE_EPSILON` are allowed and
    warned about (:class:`dpjax.PrivacyLeakWarning`, "NOT PRIVATE"); their bound is inf. A PLD
    grid too large to build falls back to RDP (a warning says so).
    """
    if (noise_multiplier is None) == (target_epsilon is None):
        _validate.fail(
            "noise_multiplier",
            noise_multiplier,
            "given, with target_epsilon=None (exactly one of noise_multiplier and "
            f"target_epsilon; got target_epsilon={target_epsilon!r})",
        )
    accounted = delta * (1.0 - SLACK_FRACTION)
    if target_epsilon is not None:
        target = _validate.epsilon("target_epsilon", target_epsilon)
        if target >= NOT_PRIVATE_EPSILON:
            _validate.fail("target_epsilon", target, f"< {NOT_PRIVATE_EPSILON:g} (e^ε finite)")
        sigma = calibrate_noise_multiplier(
            target_epsilon=target,
            delta=accounted,
            sampling_rate=q,
            steps=steps,
            accounting=accounting,
        )
        return sigma, target
    sigma = _validate.non_negative("noise_multiplier", noise_multiplier)
    if sigma == 0.0:
        _not_private("noise_multiplier=0: the clipped sums are released without noise")
        return sigma, math.inf
    inputs.refuse_vanishing_noise(sigma, noise_multiplier)
    eps = _epsilon_bound(sigma, q, steps, accounted, accounting)
    if eps >= NOT_PRIVATE_EPSILON:
        _not_private(f"noise_multiplier={sigma:g} gives ε = {eps:g} ≥ {NOT_PRIVATE_EPSILON:g}")
        return sigma, math.inf
    return sigma, eps


def _sampler_for_slack(
    n: int,
    requested_q: float,
    *,
    steps: int,
    epsilon: float,
    delta: float,
    calibrated: bool,
    max_batch_size: int | None = None,
) -> PoissonSampler:
    """A PoissonSampler whose cap keeps the truncation slack of ``steps`` steps ≤ SLACK·δ.

    ``epsilon = inf`` (a run that is not private): the cap is sized as for ε = 0, which keeps
    drops rare (at most SLACK·δ/2 over the run); no slack can be bounded, none is claimed.
    """
    budget = SLACK_FRACTION * delta
    q = realised_sampling_rate(requested_q)
    private = math.isfinite(epsilon)
    tail = budget / (steps * (1.0 + (math.exp(epsilon) if private else 1.0)))
    cap = min(n, _binomial_cap(n + 1, q, tail))
    if max_batch_size is not None:  # a larger cap only lowers the truncation slack
        given = _validate.positive_int("max_batch_size", max_batch_size)
        if not cap <= given <= n:
            _validate.fail("max_batch_size", max_batch_size, f"in [{cap}, n={n}] (the "
                           f"smallest cap keeping the truncation slack ≤ {SLACK_FRACTION:g}·δ "
                           "here, up to the number of records)")  # fmt: skip
        cap = given
    sampler = PoissonSampler(dataset_size=n, sampling_rate=requested_q, max_batch_size=cap)
    if private and sampler.delta_slack(steps, epsilon) > budget:
        if calibrated:
            inputs.refuse_epsilon_beyond_any_cap(epsilon, tail)
        _validate.fail(
            "batch_size",
            f"{requested_q * n:g} (q = {q:.4g})",
            "small enough that a padded batch of at most n rows overflows with probability "
            f"≤ {tail:.3g} per step (use a smaller batch_size or the full-batch DP-GD of "
            f"dpjax.erm; the per-step bound shrinks as e^-ε, here ε = {epsilon:.4g})",
        )
    return sampler


def make_private(
    loss_fn: Callable[..., jax.Array],
    *,
    optimizer: optax.GradientTransformation,
    l2_clip_norm: float | adaptive_clip.AdaptiveClip,
    dataset_size: int,
    batch_size: int,
    delta: float,
    key: jax.Array,
    epochs: float | None = None,
    steps: int | None = None,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    physical_batch_size: int | None = None,
    clipping: str = "auto",
    accounting: str = "pld",
    user_ids: Any = None,
    noise: Any = None,
    per_layer: bool = False,
    clip_rule: str = "flat",
    gamma: float = DEFAULT_GAMMA,
    layout: Any = None,
    budget: PrivacyFilter | None = None,
    public: Any = None,
    max_batch_size: int | None = None,
) -> PrivateTraining:
    r"""DP-SGD in one call: Poisson sampling, per-example clipping, noise once, accounting.

    Like Opacus' ``make_private`` / ``make_private_with_epsilon``: give either
    ``noise_multiplier`` σ or ``target_epsilon`` (σ is then calibrated with
    :func:`dpjax.accounting.calibrate_noise_multiplier` for the planned run), and either
    ``epochs`` (T = ⌈epochs·n/b⌉, :func:`poisson_schedule`) or ``steps`` T.

    Args:
        loss_fn: the loss of ONE example: ``loss_fn(params, example)``, or
            ``loss_fn(params, example, rng)`` (a parameter named ``rng``) to receive a JAX key
            for dropout, distinct for every (step, example) — fold ``step`` and the example's
            dataset index. ``example`` is one row of ``data`` (same pytree structure). For
            flax linen use ``model.apply({"params": params}, x, rngs={"dropout": rng})``; for
            flax nnx build it with :func:`nnx_loss`.
        optimizer: any optax optimizer; it sees the noisy normalised gradient.
        l2_clip_norm: C > 0, the per-example clip norm; with ``per_layer=True`` a float C
            (each of the L parameter leaves clipped to C/√L) or a pytree like the params of
            per-leaf norms c_l (finite, ≥ 2⁻⁴⁰; total bound sqrt(Σ c_l²)); with
            ``clip_rule="automatic"`` the scale R of automatic clipping (1.0 recommended:
            tune the learning rate instead); or a
            :class:`~dpjax.dp_sgd.AdaptiveClip` (Andrew et al. 2021): C_t follows a target
            quantile of the per-example norms from a noisy count of unclipped examples
            (:mod:`dpjax.dp_sgd.adaptive_clip`). σ is then the ACCOUNTED noise multiplier:
            the clipped sum gets σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (needs σ_b > σ/2), the run is
            accounted as DP-SGD at σ, and C_t is kept in ``state.opt_state[0]``
            (:meth:`PrivateTraining.clip_norm`; published by ``public_state``).
        dataset_size: n ≥ 1, the number of records (the leading axis of ``data``).
        batch_size: b in [1, n], the EXPECTED logical batch: q = b/n.
        delta: δ in (0, 1) of the reported guarantee (the truncation slack of the padded
            sampler is paid from it; see "Formal guarantees"). δ ≥ 1/n warns
            (:class:`dpjax.PrivacyLeakWarning`): it permits releasing a whole record.
        key: a JAX PRNG key; split into the noise key and the sampling/dropout key (each split
            again at every step, never reused; one run per object: ``init`` and ``fit``
            without ``state`` refuse a second). The whole run is a function of it: use a NEW
            key for every ``make_private`` (``dpjax.os_key()`` or ``jax.random.key`` of a
            fresh seed). Two objects built with one key draw the same batches and the same
            noise: on neighbouring data sets D, D′ the difference of their first updates is
            (S_D − S_D′)/(q·n) with NO noise, which shows whether (and in which direction) the
            differing record moved the model; in a hyperparameter sweep on one data set the
            difference of two runs' updates is noise-free as well, so releasing both is not
            the composition of two private runs the accountant would assume.
        epochs: expected passes over the data (> 0); or give ``steps``.
        steps: T ≥ 1 noisy updates; or give ``epochs``.
        noise_multiplier: σ ≥ 0; or give ``target_epsilon`` (never a default). σ = 0 is the
            clip-only baseline: allowed, NOT private — a :class:`dpjax.PrivacyLeakWarning` at
            construction and ``epsilon(state) = inf``; so is a σ whose ε reaches 700.
        target_epsilon: ε > 0 to reach after T steps at ``delta``; or give ``noise_multiplier``.
        physical_batch_size: rows processed at once (memory). When smaller than the padded
            batch, each Poisson batch is split into micro-batches
            (:meth:`~dpjax.dp_sgd.PaddedBatch.micro_batches`: every record in exactly one),
            their clipped sums accumulated and the noise added ONCE; ε is unchanged. All
            micro-batches run, padding-only ones included (time does not depend on the
            realised batch size).
        clipping: the clipping backend of :func:`~dpjax.dp_sgd.clipped_grad`: "auto", "vmap"
            or "ghost".
        accounting: "pld" (tight) or "rdp".
        user_ids: None (example-level DP), or user-level DP: an int array of length
            ``dataset_size``, one PUBLIC user id per row (or a
            :class:`~dpjax.dp_sgd.UserGrouping` from :func:`~dpjax.dp_sgd.group_users`, to cap
            the rows per user). Then neighbouring data sets differ in ALL rows of one user,
            ``batch_size`` is the expected number of USERS per batch (q = b/U over the U
            users; ``epochs`` counts passes over the users), ``dataset_size`` stays the
            number of rows, ``physical_batch_size`` counts rows (micro-batches of
            ⌊physical_batch_size/k⌋ users), ``clipping`` must be "auto" or "vmap", and ε is
            user-level: see :class:`~dpjax.dp_sgd.UserLevelTraining`.
        noise: None (DP-SGD: independent noise, Poisson sampling of all n records) or
            ``dpjax.dp_sgd.BandMF(bands=b)``: the correlated noise σ·C·(C⁻¹Z)_t of a b-banded
            strategy C (:mod:`dpjax.dp_sgd.matrix_factorization`) with cyclic Poisson
            sampling — step t samples part t mod b of the records (i mod b = part) at rate
            q = batch_size/⌈n/b⌉, and ε is that of DP-SGD over ⌈T/b⌉ rounds at σ (C has max
            column norm 1). ``batch_size`` must be ≤ ⌈n/b⌉. The parts are ROW INDICES, so
            the order of ``data``'s rows is part of the plan: resume such a run only on the
            same rows in the same order (a record moved to another part can be sampled in
            adjacent steps, which the ⌈T/b⌉-round accounting does not cover).
        per_layer: group-wise clipping (He et al. 2022): every parameter leaf of an example's
            gradient clipped to its own c_l, with ghost clipping where it supports the loss
            (``clipping`` "auto" or "ghost"). Not with ``user_ids`` or an AdaptiveClip.
        clip_rule: "flat" (clip to ≤ C) or "automatic" (AUTO-S, Bu et al. 2023: every
            example's gradient scaled by R/(‖g‖ + γ); see :func:`~dpjax.dp_sgd.clipped_grad`).
            Not with ``per_layer``, ``user_ids``, ``layout`` or an AdaptiveClip.
        gamma: γ > 0 of automatic clipping (default 0.01; ignored by flat clipping).
        layout: None (one device, or params replicated), or a
            :class:`~dpjax.dp_sgd.MeshLayout` (:func:`~dpjax.dp_sgd.mesh_layout`): parameters
            sharded over the mesh's model axis, each batch's rows over its data axis
            (:mod:`dpjax.dp_sgd.sharded`); put ``params`` on the mesh with
            ``jax.device_put(params, layout.param_shardings())``. The per-example norms are
            summed over the shards once in a fixed order, the noise of each shard is drawn on
            its devices (the same release on every mesh shape), and σ, q, C and ε are those of
            the one-device run. Example-level DP with a fixed C, no BandMF noise, no
            ``physical_batch_size`` and no ghost clipping (refused otherwise: the mesh
            materialises the per-example gradients, sharded).
        budget: None, or a :class:`~dpjax.accounting.PrivacyFilter` (RDP, or zCDP for q = 1)
            shared by everything released from the data set: every step is charged to it
            BEFORE it runs (the Poisson subsampled Gaussian's RDP at the filter's orders),
            and ``fit`` stops cleanly before the first step the filter refuses (a warning,
            ``history["stopped_early"]``, the state before that step); ``step`` raises
            :class:`~dpjax.accounting.BudgetExhaustedError` and changes nothing.
            :meth:`~PrivateTraining.public_state` then reports the filter's (ε, δ) (see
            "Formal guarantees"). Needs ``noise_multiplier`` (not ``target_epsilon``), and
            no ``noise=BandMF``. The filter is not part of the training state: save
            ``filter.state_dict()`` with every checkpoint and, on restart, pass
            ``PrivacyFilter.from_state_dict(saved)`` (a new filter would restart the budget).
        public: None, or a pytree of PUBLIC arrays (e.g. the frozen pre-trained weights of
            a fine-tuning run) passed to ``loss_fn(params, example, public=public)`` at every
            step as an ARGUMENT of the compiled step (not a constant folded into it: a large
            frozen model compiles once and fast). It is never differentiated, clipped, noised,
            updated or counted in the noise dimension d (only ``params`` is). ``loss_fn``
            must have a parameter named ``public``. See "Formal guarantees" for what it must be.
        max_batch_size: None (the smallest padded cap whose truncation slack is ≤ 10⁻³·δ), or
            a cap at least that and at most n (a larger cap only lowers the slack): runs at
            several ε with one cap have the same shapes, so they share one compiled step.

    Returns:
        A :class:`PrivateTraining` with ``noise_multiplier``, ``sampling_rate``, ``steps``,
        ``l2_clip_norm`` (the sensitivity bound: C, sqrt(Σ c_l²) per-layer, R automatic;
        the per-leaf tree in ``layer_clip_norms``), ``expected_batch_size``, ``delta``,
        ``init(params)``,
        ``step(params, state, data)``, ``epsilon(state)``, ``fit(params, data)``.

    Raises:
        ValueError: a bad argument (named, with its valid range); both or neither of
            ``epochs``/``steps`` or of ``noise_multiplier``/``target_epsilon``.
        TypeError: ``key`` missing or not a JAX PRNG key.

    Formal guarantees:
        Each update is the Gaussian mechanism with standard deviation σ·C on the clipped sum of
        a Poisson-sampled batch; that sum has ℓ2 sensitivity C under add/remove-one (each
        record contributes at most C, certified in floating point by
        :func:`~dpjax.dp_sgd.clipped_grad`; padding rows contribute exactly 0; splitting into
        micro-batches leaves the sum of the one Poisson batch unchanged). The normalisation by
        the public constant q·n, the optimizer and dropout (keys independent of the data) are
        post-processing. T updates are accounted as one
        ``PoissonSampledGaussianEvent(σ, q, count=T)`` — the Poisson subsampled Gaussian
        mechanism composed T times (Abadi et al. 2016, "Deep learning with differential
        privacy", https://arxiv.org/abs/1607.00133; amplification by subsampling), evaluated by PLD
        (dp-accounting; Doroshenko et al. 2022) or RDP (Mironov et al. 2019, "Rényi
        differential privacy of the sampled Gaussian mechanism"), at δ·(1 − 10⁻³). The padded
        sampler drops records only if more than ``max_batch_size`` are drawn; its cap is chosen
        so that the resulting slack (1 + e^ε)·T·p̄ (see :class:`~dpjax.dp_sgd.PoissonSampler`)
        is ≤ 10⁻³·δ, so ``epsilon(state)`` is an (ε, δ) guarantee with the slack included.
        σ·C reaches the compiled update as an argument that ``step`` passes from the
        object's own plan (the σ its ledger row records and ``epsilon`` charges); no caller
        supplies it. With ``public``: the guarantee covers ``params`` as a function of the
        private data, with ``public`` a constant of the mechanism — public params are assumed
        public, i.e. fixed independently of the private records (pre-trained on disjoint data,
        not chosen or tuned with them); a ``public`` fitted on the private data carries its
        own privacy cost, which nothing here accounts.
        What it covers: the sequence of parameters θ₁, …, θ_t and
        :meth:`~PrivateTraining.public_state` (step count, optimizer moments with the noise
        states reduced to their counts, the plan ledger, (ε, δ)) — functions of the noisy sums
        and public constants. NOT covered: the keys — the :class:`PrivateState` is a SECRET
        checkpoint (its key data fixes every later batch and noise draw: with it and one later
        model the noise-free clipped sum is recovered) — and the ``metrics`` of ``step`` /
        ``fit`` (realised batch size, loss), which are not private. Resume: a state restored
        from its checkpoint continues its key streams (nothing is replayed); ``step`` and
        ``fit`` refuse a state whose current phase is another plan (σ, q, C, normaliser, n,
        cap, relation); :meth:`~PrivateTraining.continue_from` opens a new phase and
        ``epsilon`` then reports the composition of all phases (tight when the truncation slack
        fits at the composed ε, else the basic composition of the phases). Re-run: one run per
        object (``init``, ``fit`` without ``state``); a new run needs a new key. Out of scope
        (the accounting trusts the state): editing ``step`` or ``plan`` by hand, stepping twice
        from one state, and two objects sharing a key. Past the plan: ``fit`` refuses before
        its first step a run whose δ could not hold the truncation slack and warns once
        otherwise; ``step`` is traced code and is not refused: ``epsilon(state)`` counts every
        step taken, warns past the plan, and raises if the slack no longer fits in δ.
        ``dataset_size`` is public (it fixes the cap and the normaliser q·n, and ``step``
        refuses data of any other length): a removed record is modelled as a row that is never
        sampled and contributes 0 ("zero-out" neighbours, Kairouz et al. 2021, "Practical and
        private (deep) learning without sampling or shuffling"), which the Poisson
        add/remove-one analysis covers; the cap is sized for n + 1 rows. With ``user_ids``
        every statement above holds with "user" for "record": each sampled user contributes
        one vector of norm ≤ C (the mean of its rows' clipped gradients, re-clipped and
        certified: :func:`~dpjax.dp_sgd.clipped_user_sum`), users are Poisson-sampled at q =
        b/U, the normaliser is q·U and the event is ``PoissonSampledGaussianEvent(σ, q, T)``
        over users (McMahan et al. 2018, "Learning differentially private recurrent language
        models"); the grouping is public and recorded in the plan.
        Adaptive clipping
        (``l2_clip_norm=AdaptiveClip(...)``): each step is the Gaussian mechanism on the pair
        (clipped sum in units of C_t, centred unclipped count) with noise (σ_Δ, σ_b) and
        sensitivities (1, 1/2), i.e. noise multiplier σ (Andrew et al. 2021, "Differentially
        private learning with adaptive clipping", Theorem 1); T steps are accounted as the
        same ``PoissonSampledGaussianEvent(σ, q, count=T)``. C_t is a function of earlier
        noisy releases: public, published in ``public_state`` and covered by the guarantee;
        the plan ledger records (C_0, γ, η, σ_b), so a resume under another config is refused
        (see :mod:`dpjax.dp_sgd.adaptive_clip`).
        Per-layer clipping (``per_layer=True``): each leaf l of an example's gradient is
        clipped to f·c_l from a certified bound of its own norm (ghost or vmap), so the
        example contributes at most sqrt(Σ_l c_l²) =: C and everything above holds with this
        C: noise σ·C, the same event (He et al. 2022, "Exploring the limits of differentially
        private deep learning with group-wise clipping", https://arxiv.org/abs/2212.01539, §3).
        Automatic clipping (``clip_rule="automatic"``): each example contributes
        R·g/(‖g‖ + γ), certified ≤ R as computed, so everything above holds with C = R (Bu et
        al. 2023, "Automatic clipping: differentially private deep learning made easier and
        stronger", https://arxiv.org/abs/2206.07136, §4: as private as clipping at R).
        With ``noise=BandMF(bands=b)`` the noise of step t is σ·C·(C⁻¹Z)_t for the b-banded C
        (max column norm 1) and step t samples only part t mod b: the run is accounted as
        ``PoissonSampledGaussianEvent(σ, q, count=⌈T/b⌉)`` on parts of ⌈n/b⌉ records
        (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Theorem 4);
        the noise buffers of the state are secret like its keys (``public_state`` drops them),
        and the strategy covers T steps: steps past T are refused (NaN under ``jit``). A
        record's part is its row index mod b, so the guarantee covers a run whose every step
        sees the rows of its first step in the same order: the SECRET state records a digest
        of the rows keyed by the run's key (never the public ledger) and ``step``/``fit``
        refuse other data or another row order (NaN under ``jit``).
        With ``budget=filter`` (adaptive runs: σ, q, C or the length chosen from earlier
        releases of the same data — several ``make_private`` runs, a tuning loop, a stop on
        a noisy private metric charged to the same filter): each step, a
        ``PoissonSampledGaussianEvent(σ, q, count=1)``, is charged to the filter before it
        runs (``step`` checks on the host; a state traced by your own ``jax.jit`` is refused),
        so the whole interaction is (ε_F, δ_F)-DP by the filter's theorem
        (:class:`~dpjax.accounting.PrivacyFilter`: Feldman & Zrnic 2021, Theorem 3.1,
        https://arxiv.org/abs/2008.11193), for every release charged to it. The padded
        sampler's truncation slack is bounded for the most steps the filter can ever allow
        this object (its remaining budget at construction over one step's cost) at ε_F, kept
        ≤ 10⁻³·δ by the cap, and reserved in the filter (``filter.delta_total``), which is the
        δ that ``public_state`` reports with ε_F. ``epsilon(state)`` stays the ε of this
        object's steps as a fixed plan: it is not the guarantee of an adaptive interaction.

    Example:
        >>> import jax, jax.numpy as jnp, optax, dpjax
        >>> x = jax.random.normal(jax.random.key(1), (200, 3))
        >>> data = {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}
        >>> loss_fn = lambda w, ex: 0.5 * (ex["x"] @ w - ex["y"]) ** 2
        >>> private = dpjax.make_private(loss_fn, optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
        ...     dataset_size=200, batch_size=20, epochs=2, noise_multiplier=1.0, delta=1e-5,
        ...     key=jax.random.key(0))
        >>> private.steps, private.expected_batch_size
        (20, 20.0)
        >>> w, state, history = private.fit(jnp.zeros(3), data, progress=False)
        >>> int(state.step), round(private.epsilon(state), 2)
        (20, 3.59)
    """
    if not callable(loss_fn):
        _validate.fail("loss_fn", loss_fn, "a callable loss_fn(params, example[, rng])")
    if not isinstance(optimizer, optax.GradientTransformation):
        _validate.fail("optimizer", optimizer, "an optax.GradientTransformation")
    key = _check_key(key)
    _validate.one_of("clip_rule", clip_rule, CLIP_RULES)
    layered = bool(per_layer) or clip_rule == "automatic"
    if layered and (user_ids is not None or isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip)):
        _validate.fail(
            "per_layer" if per_layer else "clip_rule",
            per_layer if per_layer else clip_rule,
            "its default (flat clipping at one C) with user_ids or an AdaptiveClip",
        )
    if layered:  # validated as clipped_grad takes it (a ValueError naming the argument)
        probe = clipped_grad(
            _no_loss,
            l2_clip_norm=l2_clip_norm,
            per_layer=bool(per_layer),
            clip_rule=clip_rule,
            gamma=gamma,
        )
        layer_clip_norms = l2_clip_norm if per_layer else None
        l2_clip_norm, gamma = probe.l2_norm_bound, probe.gamma
    else:
        layer_clip_norms, gamma = None, None
    l2_clip_norm = adaptive_clip.resolve_clip(l2_clip_norm)
    rows = _validate.positive_int("dataset_size", dataset_size)
    grouping = None
    if user_ids is not None:  # user level: the sampled units are users (dpjax.dp_sgd.user_level)
        from dpjax.dp_sgd import user_level  # noqa: PLC0415 (it subclasses PrivateTraining)

        if isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip):
            _validate.fail(
                "l2_clip_norm",
                l2_clip_norm,
                "a float C > 0 with user_ids (adaptive clipping is example level only)",
            )
        grouping = user_level.as_grouping(user_ids, rows)
    n = rows if grouping is None else grouping.num_users
    batch_size = _validate.positive_int("batch_size", batch_size)
    if batch_size > n:
        units = "dataset_size" if grouping is None else "the number of users"
        _validate.fail("batch_size", batch_size, f"in [1, {units}={n}]")
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    warn_if_delta_reveals_records(delta, n, "make_private")
    _validate.one_of("clipping", clipping, CLIPPING_BACKENDS)
    _validate.one_of("accounting", accounting, ACCOUNTING_METHODS)
    if physical_batch_size is not None:
        physical_batch_size = _validate.positive_int("physical_batch_size", physical_batch_size)
    _check_layout(layout, physical_batch_size, grouping, noise, l2_clip_norm)
    _check_budget(budget, target_epsilon, noise_multiplier, noise)
    if layout is not None and clipping == "ghost":  # the mesh materialises per-example grads
        _validate.fail("clipping", clipping, '"auto" or "vmap" with layout= (a sharded run)')
    if layout is not None and layered:  # the sharded path clips flat at one C
        name = "per_layer" if per_layer else "clip_rule"
        _validate.fail(name, per_layer if per_layer else clip_rule, "its default with layout=")
    steps = _resolve_steps(n, batch_size, epochs, steps)
    q, records, rounds = batch_size / n, n, steps
    if noise is not None and (
        grouping is not None or isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip)
    ):
        _validate.fail(
            "noise",
            noise,
            "None with user_ids or an AdaptiveClip (correlated noise is analysed here for "
            "example-level DP-SGD with a fixed C only)",
        )
    if noise is not None:  # banded MF: DP-SGD over ⌈T/b⌉ rounds of parts of ⌈n/b⌉ records
        noise = _resolve_mf_noise(noise, dataset_size=n, batch_size=batch_size, steps=steps)
        q, records, rounds = noise.sampling_rate, noise.part_size, noise.rounds(steps)
    sigma, eps_bound = _resolve_noise(
        noise_multiplier,
        target_epsilon,
        delta=delta,
        q=realised_sampling_rate(q),
        steps=rounds,
        accounting=accounting,
    )
    adaptive_clip.check_budget(l2_clip_norm, sigma)
    inputs.refuse_overflowing_noise_std(l2_clip_norm, sigma)
    sampler = _sampler_for_slack(
        records,
        q,
        steps=rounds,
        epsilon=eps_bound,
        delta=delta,
        calibrated=target_epsilon is not None,
        max_batch_size=max_batch_size,
    )
    if noise is not None:
        sampler = noise.sampler(sampler, n)
    reserved = 0.0
    if budget is not None:
        sampler, reserved = _budget_sampler(
            budget,
            sampler,
            sigma=sigma,
            steps=rounds,
            epsilon=eps_bound,
            delta=delta,
        )
    cls, unit = PrivateTraining, {}
    if grouping is not None:
        cls, unit = user_level.UserLevelTraining, {"grouping": grouping}
    return cls(
        **unit,
        loss_fn=loss_fn,
        optimizer=optimizer,
        sampler=sampler,
        noise_multiplier=sigma,
        l2_clip_norm=l2_clip_norm,
        steps=steps,
        delta=delta,
        key=key,
        physical_batch_size=physical_batch_size,
        clipping=clipping,
        accounting=accounting,
        noise=noise,
        layer_clip_norms=layer_clip_norms,
        gamma=gamma,
        layout=layout,
        budget=budget,
        budget_slack=reserved,
        public=public,
    )


def _check_budget(budget: Any, target_epsilon: Any, noise_multiplier: Any, noise: Any) -> None:
    """A budget charges each step of a given σ > 0 with independent noise."""
    if budget is None:
        return
    if not isinstance(budget, PrivacyFilter):
        _validate.fail("budget", budget, "None or a dpjax.accounting.PrivacyFilter")
    if target_epsilon is not None or noise is not None or noise_multiplier == 0:
        _validate.fail(
            "budget",
            budget,
            "None with target_epsilon, noise=BandMF or noise_multiplier=0 (a budget charges "
            "each step of a given σ > 0 with independent noise)",
        )


def _budget_sampler(
    budget: Any,
    sampler: PoissonSampler,
    *,
    sigma: float,
    steps: int,
    epsilon: float,
    delta: float,
) -> tuple[PoissonSampler, float]:
    """The sampler re-sized for the steps ``budget`` can allow, and its slack bound.

    The cap keeps the truncation slack (1 + e^ε_F)·N·p̄ ≤ SLACK_FRACTION·δ, with N the most
    steps the filter can ever allow this object (it only shrinks as more is charged) and ε_F
    the filter's ε; that bound is what the object reserves in the filter."""
    event = PoissonSampledGaussianEvent(
        noise_multiplier=sigma, sampling_rate=sampler.sampling_rate, count=1
    )
    try:
        allowed = budget.max_releases(event)
    except ValueError as err:
        _validate.fail("budget", budget, f"a filter that can charge a DP-SGD step ({err})")
    if allowed == 0:
        _validate.fail("budget", budget, "a filter with room for at least one step")
    if not math.isfinite(allowed):
        _validate.fail("budget", budget, "a filter whose cost of one step is > 0")
    cap_epsilon = max(budget.epsilon, epsilon if math.isfinite(epsilon) else 0.0)
    resized = _sampler_for_slack(
        sampler.dataset_size,
        sampler.requested_sampling_rate,
        steps=max(steps, allowed),
        epsilon=cap_epsilon,
        delta=delta,
        calibrated=False,
    )
    return resized, resized.delta_slack(allowed, budget.epsilon)


def _no_loss(params: Any, *example: Any) -> jax.Array:
    """A placeholder loss: ``clipped_grad`` validates the clipping arguments without calling it."""
    return jnp.zeros(())


def _check_layout(layout: Any, physical_batch_size: Any, grouping: Any, noise: Any, clip: Any):
    """A sharded run is example-level DP-SGD with a fixed C in one call per batch."""
    if layout is None:
        return
    from dpjax.dp_sgd.sharded import MeshLayout  # noqa: PLC0415

    if not isinstance(layout, MeshLayout):
        _validate.fail("layout", layout, "None or a MeshLayout from dpjax.dp_sgd.mesh_layout")
    others = {
        "physical_batch_size": physical_batch_size,
        "user_ids": grouping,
        "noise": noise,
        "l2_clip_norm": clip if isinstance(clip, adaptive_clip.AdaptiveClip) else None,
    }
    for name, value in others.items():
        if value is not None:
            _validate.fail(name, value, f"its default with layout= (a sharded run); got {value!r}")


def _resolve_mf_noise(noise: Any, **kwargs: Any) -> Any:
    """The ``noise=`` switch fixed for this run (see :mod:`~dpjax.dp_sgd.matrix_factorization`)."""
    from dpjax.dp_sgd.matrix_factorization.config import BandMF  # noqa: PLC0415

    if not isinstance(noise, BandMF):
        _validate.fail("noise", noise, "None (DP-SGD) or dpjax.dp_sgd.BandMF(bands=b)")
    return noise.resolve(**kwargs)
