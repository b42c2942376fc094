"""One DP-SGD update of :class:`~dpjax.dp_sgd.PrivateTraining`, jit-compiled.

Sample a Poisson batch, gather its rows, clip per example with the mask (padding contributes
exactly 0), accumulate the micro-batches' clipped sums (double-float, rounded once, certified),
add the noise once, normalise by the public q·n and apply the optimizer. A state whose current
phase is another plan is refused on the host (voided to NaN when traced by the caller's jit).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _noise, _validate
from dpjax.dp_sgd import adaptive_clip
from dpjax.dp_sgd._vmap_guard import void_unless as _void_unless
from dpjax.dp_sgd.matrix_factorization import row_order as _row_order
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.dp_sgd.training import ledger as _plan
from dpjax.dp_sgd.training.state import PrivateState, _as_private_state, _steps_of

__all__ = ["Stepping"]


class Stepping:
    """The update of a :class:`~dpjax.dp_sgd.PrivateTraining` (a mixin of it).

    Reads the attributes ``PrivateTraining.__init__`` sets: ``sampler``, ``noise``,
    ``grad_fn``, ``physical_batch_size`` and the private ``_tx``, ``_plan``, ``_host``,
    ``_jitted_step``, ``_row_check``, ``_adaptive``, ``_uses_rng``, ``_impl``; the loss is
    ``_example_loss``.
    """

    def _check_params(self, params: Any) -> None:
        """Parameters are floating-point arrays (``jax.grad`` differentiates them)."""
        leaves = jax.tree.leaves(params)
        if not leaves:
            _validate.fail("params", params, "a pytree of floating-point arrays (none found)")
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                _validate.fail(
                    "params",
                    f"a leaf of dtype {jnp.result_type(leaf)} at {jax.tree_util.keystr(path)}",
                    "floating-point leaves only (they are differentiated and updated; keep "
                    "integer or boolean state out of params)",
                )

    def _check_data(self, data: Any) -> None:
        leaves = jax.tree.leaves(data)
        if not leaves:
            _validate.fail("data", data, "an array or a pytree of arrays with leading axis n")
        n = self.sampler.dataset_size
        for leaf in leaves:
            shape = jnp.shape(leaf)
            if not shape or shape[0] != n:
                _validate.fail(
                    "data", f"a leaf of shape {shape}", f"arrays with leading axis dataset_size={n}"
                )

    def step(self, params: Any, state: PrivateState, data: Any) -> tuple[Any, PrivateState, dict]:
        """One DP-SGD update (jit-compiled; also traceable inside your own ``jax.jit``).

        Samples a Poisson batch, gathers its rows of ``data``, clips per example with the mask
        (padding contributes exactly 0), accumulates the micro-batches' clipped sums, adds
        N(0, (σC)²) once, divides by q·n and applies the optimizer.

        Args:
            params: the parameters (any pytree).
            state: the :class:`PrivateState` from ``init`` or the previous step.
            data: an array or a pytree of arrays, every leaf with leading axis n; ``loss_fn``
                receives one row of it (same structure, leading axis removed).

        Returns:
            ``(params, state, metrics)``; ``metrics`` (loss: mean loss over the batch, one
            extra forward pass; batch_size; num_clipped; num_nonfinite) are NOT private: for
            monitoring only.

        Raises:
            ValueError: ``state``'s current phase is another plan (σ, q, C, normaliser, n,
                cap or relation; use :meth:`continue_from`), or a template/invalid ledger.
                Checked on the host once per plan array (the ledger is passed through
                unchanged, so a run syncs once). When ``state`` is traced by your own
                ``jax.jit`` / ``lax.scan`` it cannot raise: a state whose current phase is
                not this plan (a template's zero key data, whose noise is public; another
                plan, which ``epsilon`` would charge at the wrong σ, q) returns NaN
                parameters and optimizer state instead, so nothing computed from it is
                released. With ``noise=BandMF(b)``: ``data`` other than the rows of the
                run's first step in the same order (a record's part is its row index mod b;
                a keyed digest in the secret state records them; NaN under your own
                ``jax.jit``), a state without that record, or a state at the end of the
                plan (its ``steps`` noise rows used: a further step has none; NaN under your
                own ``jax.jit``). With ``make_private(budget=...)``: a state traced by your
                own ``jax.jit`` (the step is charged on the host).
            BudgetExhaustedError: ``make_private(budget=filter)`` and the filter refuses
                this step (nothing ran; the state is unchanged).
        """
        self._check_plan(state)
        self._check_params(params)
        self._check_data(data)
        self._refuse_past_strategy(state)
        self._charge_budget(state, params, data)
        digest = None
        if self.noise is not None:  # banded MF: the rows must keep the first step's order
            record = _row_order.record_of(state.opt_state)
            digest = self._row_check.digest(record, data, lambda: _steps_of(state))
        # σ·C of THIS object's plan (the σ its ledger row records and epsilon charges), as
        # an argument: one compiled step for every σ; never a value from the caller
        stddev = None
        if self._runtime_stddev is not None:  # float64 under x64, else rounded UP to float32
            canonical = jax.dtypes.canonicalize_dtype(np.float64)
            stddev = _noise.scale_rounded_up(self._runtime_stddev, canonical)
        params, (count, key, opt_state), metrics = self._jitted_step(
            params, state.step, state.key, state.opt_state, data, digest, stddev, self.public
        )
        if digest is not None and _validate.is_concrete(digest):  # checked on the host: keep
            opt_state = _row_order.attach(opt_state, _row_order.RowOrder(record.key, digest))
        if not _validate.is_concrete(state.plan):
            params, opt_state = self._void_unless_this_plan(state.plan, (params, opt_state))
        return params, PrivateState(count, key, opt_state, state.plan), metrics

    def _charge_budget(self, state: Any, params: Any, data: Any) -> None:
        """Charge this step to ``make_private``'s ``budget`` BEFORE it runs (host-side).

        Raises:
            BudgetExhaustedError: the filter refuses the step (nothing runs or changes).
            ValueError: a traced state (the charge must happen on the host, once per step).
        """
        if self.budget is None:
            return
        # params and data too: a jit over a closed-over concrete state would charge once, at
        # trace time, and then run every later call (new params, new data) uncharged
        for name, value in (("state", state), ("params", params), ("data", data)):
            if not all(_validate.is_concrete(x) for x in jax.tree.leaves(value)):
                _validate.fail(
                    name,
                    f"a {name} traced by jax.jit",
                    f"a concrete {name} when make_private has a budget (each step is charged "
                    "to the filter on the host before it runs; call step outside your own jit)",
                )
        self.budget.spend(self._step_event)

    def _void_unless_this_plan(self, ledger: jax.Array, released: Any) -> Any:
        """``released`` with every float leaf NaN unless the traced ``ledger``'s current row
        is this plan (every word but the row count and the phase's start step, which vary)."""
        word = _plan.RELATION_WORD  # relation (low 8 bits) and row count (varies)
        row = _plan.ledger_row(self._plan, 0)
        ext = _plan.EXTENSION  # adaptive clipping's config
        ok = jnp.all(ledger[-1, :word] == jnp.asarray(row[:word])) & (
            (ledger[-1, word] & 0xFF) == int(row[word] & 0xFF)
        )
        # adaptive clipping's config and the privacy unit (user level: k and grouping);
        # legacy rows (fixed C, example level) read as zeros
        tail = ledger[-1, ext:] if ledger.shape[1] > ext else jnp.zeros_like(row[ext:])
        ok = ok & jnp.all(tail == jnp.asarray(row[ext:]))

        return _void_unless(ok, released)

    def _refuse_past_strategy(self, state: Any) -> None:
        """BandMF: refuse (host-side) a step from a state whose noise has used every row of the
        n = ``steps`` factorization (a step past it has no noise row: NaN under ``jit``)."""
        opt_state = _as_private_state(state).opt_state
        if self.noise is None or not isinstance(opt_state, tuple) or not opt_state:
            return
        count = getattr(opt_state[0], "count", None)
        if count is None or not _validate.is_concrete(count) or int(count) < self.steps:
            return
        _validate.fail(
            "state",
            f"a state after {int(count)} steps of this BandMF plan",
            f"a state before the end of the plan (steps={self.steps}): the factorization has "
            "n = steps rows and a step past it has no noise row (it would return NaN); plan "
            "more steps in make_private",
        )

    def _check_plan(self, state: Any) -> None:
        """Refuse a state whose current phase is not this object's plan (host-side).

        An object that steps a state counts as having run (see :meth:`init`): rebuilt with
        the key of the run it resumes (a restart of the same script), a fresh ``init`` /
        ``fit`` without ``state`` would replay that run's batches and noise."""
        state = _as_private_state(state)
        ledger = state.plan
        if ledger is self._host["verified"] or not _validate.is_concrete(ledger):
            self._host["started"] = True
            return
        current = _plan.current_plan(ledger)
        if current != self._plan:
            _validate.fail(
                "state",
                f"a state whose current phase is another plan ({current.describe()})",
                f"a state of this plan ({self._plan.describe()}): continue it under this "
                "plan with state = private.continue_from(state) (ε then composes both "
                "phases), or step it with the PrivateTraining that made it",
            )
        self._host["verified"] = ledger
        self._host["started"] = True

    def _step_impl(
        self,
        params: Any,
        count: jax.Array,
        key_data: jax.Array,
        opt: Any,
        data: Any,
        digest: jax.Array | None = None,
        stddev: jax.Array | None = None,
        public: Any = None,
    ):
        """The traced update; ``public`` reaches the loss through :meth:`_traced_public` (an
        argument of this compiled function, not a constant folded into it)."""
        self._host["public_in_trace"] = public
        try:
            return self._traced_step(params, count, key_data, opt, data, digest, stddev)
        finally:
            self._host["public_in_trace"] = None

    def _traced_step(self, params, count, key_data, opt, data, digest, stddev):
        key = jax.random.wrap_key_data(key_data, impl=self._impl)
        next_key, sample_key, dropout_key = jax.random.split(key, 3)
        if self.noise is None:
            batch = self.sampler.sample(sample_key)
        else:  # cyclic Poisson: the part of this step
            batch = self.sampler.sample_at(sample_key, count)
        clip = opt[0].clip_norm if self._adaptive else None
        if self.physical_batch_size is None:
            clipped_sum, stats = self._clipped_part(params, data, batch, dropout_key, clip)
        else:
            clipped_sum, stats = self._accumulate(params, data, batch, dropout_key, clip)
        loss_sum, size, num_clipped, num_nonfinite, centred = stats
        if self._adaptive:
            updates, opt_state = self._tx.update(clipped_sum, opt, params, centred_count=centred)
        elif stddev is not None:
            updates, opt_state = self._tx.update(clipped_sum, opt, params, noise_stddev=stddev)
        else:
            updates, opt_state = self._tx.update(clipped_sum, opt, params)
        params = _apply_updates(params, updates)
        if digest is not None:  # banded MF: another row order voids the step (NaN)
            record = _row_order.record_of(opt)
            opt_state, ok = _row_order.checked_in_graph(count, opt_state, record, digest)
            params, opt_state = _void_unless(ok, (params, opt_state))
        metrics = {
            "loss": loss_sum / jnp.maximum(size, 1).astype(loss_sum.dtype),
            "batch_size": size,
            "num_clipped": num_clipped,
            "num_nonfinite": num_nonfinite,
        }
        return params, (count + 1, jax.random.key_data(next_key), opt_state), metrics

    def _clipped_part(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any
    ):
        """Clipped sum and (loss sum, size, #clipped, #non-finite, centred #unclipped) of one
        (micro-)batch; ``clip``: C_t of adaptive clipping (the loss is divided by it), or None."""
        examples = jax.tree.map(lambda x: jnp.take(x, batch.indices, axis=0), data)
        extra: tuple[jax.Array, ...] = ()
        if self._uses_rng:  # one stream per (step, dataset index): fold the index in
            fold = lambda i: jax.random.key_data(jax.random.fold_in(dropout_key, i))  # noqa: E731
            extra = (jax.vmap(fold)(batch.indices),)
        scaled = () if clip is None else (jnp.full(batch.mask.shape, clip, jnp.float32),)
        clipped_sum, info = self.grad_fn(params, examples, *scaled, *extra, mask=batch.mask)
        centred = adaptive_clip.centred_unclipped_count(
            info.per_example_norms, batch.mask, self.grad_fn.l2_norm_bound
        )
        in_axes = (None, 0) + (0,) * len(extra)
        losses = jax.vmap(self._example_loss, in_axes=in_axes)(params, examples, *extra)
        loss_sum = jnp.sum(jnp.where(batch.mask, losses, jnp.zeros((), losses.dtype)))
        size = jnp.sum(batch.mask, dtype=jnp.int32)
        return clipped_sum, (loss_sum, size, info.num_clipped, info.num_nonfinite, centred)

    def _accumulate(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any
    ):
        """Sum the clipped sums of the batch's micro-batches (each record in exactly one).

        The k micro-batch sums are added in double-float (TwoSum, micro-batch order) and
        rounded once, then multiplied by the public ρ ≤ 1 of
        :func:`dpjax.dp_sgd._certified.accumulation_scale`: each micro-batch's sum is
        certified for its own m rows, ρ covers the rounding of the k·m-row total, so adding
        or removing one record moves the released sum by ≤ C (Casacuberta et al. 2022).
        """
        from dpjax.dp_sgd import _certified  # noqa: PLC0415 (this method only)

        micro = batch.micro_batches(self.physical_batch_size)
        calls, rows = micro.mask.shape

        def body(total, mb):
            s, stats = self._clipped_part(params, data, PaddedBatch(*mb), dropout_key, clip)
            (hi, lo), total_stats = total
            add = lambda a, b: a + b.astype(a.dtype)  # noqa: E731
            pairs = [
                _certified.df_add((h, x), (y.astype(h.dtype), jnp.zeros_like(h)))
                for h, x, y in zip(
                    jax.tree.leaves(hi), jax.tree.leaves(lo), jax.tree.leaves(s), strict=True
                )
            ]
            treedef = jax.tree.structure(hi)
            hi = jax.tree.unflatten(treedef, [p[0] for p in pairs])
            lo = jax.tree.unflatten(treedef, [p[1] for p in pairs])
            return ((hi, lo), jax.tree.map(add, total_stats, stats)), None

        first = PaddedBatch(micro.indices[0], micro.mask[0])
        shapes = jax.eval_shape(self._clipped_part, params, data, first, dropout_key, clip)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        init = ((zeros[0], zeros[0]), zeros[1])
        ((hi, lo), stats), _ = jax.lax.scan(body, init, (micro.indices, micro.mask))
        clipped_sum = jax.tree.map(lambda h, x: _certified.df_round((h, x), h.dtype), hi, lo)
        # ρ from the shrink the micro-batch calls used (recorded when they were traced above)
        f = self.grad_fn.recorded_shrink(self.grad_fn.release_for(rows))
        dt = max((x.dtype for x in jax.tree.leaves(clipped_sum)), key=_certified.unit_roundoff)
        rho = _certified.accumulation_scale(f, rows, calls, dt, self.grad_fn.l2_norm_bound)
        if rho < 1.0:
            clipped_sum = jax.tree.map(lambda x: x * jnp.asarray(rho, x.dtype), clipped_sum)
        return clipped_sum, stats


def _apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` added in the wider of the two dtypes and cast ONCE to the params'.

    The noisy update of float16/bfloat16 parameters arrives in float32 (clipped sum, noise and
    normaliser are float32); adding it to the parameters promoted to float32 and rounding the
    result once keeps it finite wherever the new parameters are, also under
    ``jax_numpy_dtype_promotion="strict"`` (where ``optax.apply_updates`` refuses the mix).
    """

    def add(p: Any, u: Any) -> Any:
        if p is None:
            return None
        p_dtype = jnp.result_type(p)
        wide = _wider_float(p_dtype, jnp.result_type(u))
        return (jnp.asarray(p, wide) + jnp.asarray(u, wide)).astype(p_dtype)

    return jax.tree.map(add, params, updates, is_leaf=lambda x: x is None)


def _wider_float(a: Any, b: Any) -> Any:
    """The float dtype of more bits of ``a`` and ``b`` (float32 for float16 with bfloat16)."""
    a, b = jnp.dtype(a), jnp.dtype(b)
    if a == b:
        return a
    bits_a, bits_b = jnp.finfo(a).bits, jnp.finfo(b).bits
    if bits_a == bits_b:
        return jnp.dtype(jnp.float32)
    return a if bits_a > bits_b else b
