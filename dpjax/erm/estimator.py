"""A scikit-learn style private logistic regression on top of the :mod:`dpjax.erm` solvers.

:class:`PrivateLogisticRegression` does the hand work the raw solvers leave to the caller:
any two class labels (mapped to ±1), an intercept (a constant feature), rows clipped to norm 1
(a data-independent, per-record step), a public default μ, float64 inside (without touching
the caller's global ``jax_enable_x64`` flag), and ``predict`` / ``predict_proba`` / ``score``.

scikit-learn is optional: when it is importable the class subclasses
``sklearn.base.BaseEstimator`` and ``ClassifierMixin`` (``clone``, pipelines, grid search);
without it the same methods are provided here. dpjax never imports scikit-learn at import time
unless it is installed.

The row map (public, applied to every row independently, so it never changes a neighbouring
relation), from the PUBLIC scale the caller states (in the spirit of diffprivlib's
``data_norm`` and ``bounds``): clip each feature to ``bounds = (lower, upper)`` (if given), then
clip the row around the box centre m to ‖x − m‖ ≤ D = ``data_norm`` (default: the half-diagonal
of the box, or 1 without bounds), and hand the solvers x̃ = (x_clipped − m)/D, of norm ≤ 1. With
``fit_intercept`` x̃ is scaled by √(1 − s²) and the constant s = ``intercept_scaling`` appended,
so the augmented row has norm ≤ 1 and the solvers' ‖x_i‖ ≤ 1 assumption holds with the constant
feature counted. Without either argument the scale is ‖x‖ ≤ 1 and a :class:`PrivacyLeakWarning`
says so: raw features (breast cancer: norms in the hundreds) are then all clipped to the unit
sphere and the model returns the majority class (0.629 on breast cancer, 0.90 standardised).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from dpjax import _validate
from dpjax._warnings import PrivacyLeakWarning

__all__ = [
    "PrivacyLeakWarning",
    "PrivateLogisticRegression",
    "PublicScale",
    "clip_rows",
    "clip_to_scale",
    "public_scale",
    "public_features",
    "default_mu",
    "SOLVERS",
    "DEFAULT_RADIUS",
]

SOLVERS = ("objective", "output", "dp_gd")

DEFAULT_RADIUS = 10.0
"""Public prior on ‖w*‖ for unit-norm rows (sets the default μ and DP-GD's projection ball)."""

try:  # scikit-learn is optional: subclass its bases only when it is importable
    from sklearn.base import BaseEstimator as _Base
    from sklearn.base import ClassifierMixin as _Mixin

    _HAVE_SKLEARN = True
except ImportError:  # pragma: no cover - exercised only without scikit-learn
    _HAVE_SKLEARN = False

    class _Base:  # type: ignore[no-redef]
        """Minimal get_params/set_params (scikit-learn's BaseEstimator contract)."""

        @classmethod
        def _get_param_names(cls) -> list[str]:
            import inspect

            params = inspect.signature(cls.__init__).parameters.values()
            return sorted(p.name for p in params if p.name != "self" and p.kind == p.KEYWORD_ONLY)

        def get_params(self, deep: bool = True) -> dict:
            return {name: getattr(self, name) for name in self._get_param_names()}

        def set_params(self, **params):
            valid = self._get_param_names()
            for name, value in params.items():
                if name not in valid:
                    _validate.fail("parameter", name, f"one of {valid!r}")
                setattr(self, name, value)
            return self

    class _Mixin:  # type: ignore[no-redef]
        def score(self, X, y, sample_weight=None):
            return float(np.average(self.predict(X) == np.asarray(y), weights=sample_weight))


def clip_rows(X) -> np.ndarray:
    """x ↦ x / max(1, ‖x‖) per row, in float64 (a public, per-record map: rows with ‖x‖ ≤ 1
    are unchanged). The result satisfies ‖x‖ ≤ 1 up to one float64 rounding, which the solvers
    accept (see :func:`dpjax.erm._common.prepare_data`)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.maximum(norms, 1.0)


class PublicScale(NamedTuple):
    """The public row map's constants: feature box [lower, upper] (or None), centre m, radius D."""

    lower: np.ndarray | None
    upper: np.ndarray | None
    center: np.ndarray
    radius: float


def public_scale(d: int, *, data_norm=None, bounds=None) -> PublicScale:
    """Validate the caller's public scale for d features (no data is read).

    Args:
        d: number of features.
        data_norm: D > 0, a public bound on ‖x − m‖ (m the centre of ``bounds``, else 0).
        bounds: ``(lower, upper)``, scalars or (d,) arrays with lower < upper, finite.

    Returns:
        A :class:`PublicScale`; D defaults to ‖(upper − lower)/2‖ with bounds, else 1.

    Raises:
        ValueError: a non-positive or non-finite ``data_norm``, malformed ``bounds``.
    """
    lower = upper = None
    center = np.zeros(d)
    if bounds is not None:
        try:
            lower, upper = (np.broadcast_to(np.asarray(b, np.float64), (d,)) for b in bounds)
        except (TypeError, ValueError):
            _validate.fail("bounds", bounds, f"a pair (lower, upper) of scalars or ({d},) arrays")
        if not (
            np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)) and np.all(lower < upper)
        ):
            _validate.fail("bounds", bounds, "finite (lower, upper) with lower < upper per feature")
        center = 0.5 * (lower + upper)
    if data_norm is None:
        radius = 1.0 if bounds is None else float(np.linalg.norm(0.5 * (upper - lower)))
    else:
        radius = float(_validate.positive("data_norm", data_norm))
        if not math.isfinite(radius):
            _validate.fail("data_norm", data_norm, "a finite public bound on the row norm")
    return PublicScale(lower, upper, center, radius)


def clip_to_scale(X, scale: PublicScale) -> tuple[np.ndarray, np.ndarray]:
    """Rows clipped to the public scale, in the ORIGINAL coordinates, and which rows changed.

    Box clip to [lower, upper] (if given), then ‖x − m‖ ≤ D. Both are per-record public maps.

    Returns:
        ``(clipped, changed)``: (n, d) float64 points and a (n,) bool mask of rows the map moved
        (data-dependent: for the data holder only, NOT private).
    """
    X = np.asarray(X, dtype=np.float64)
    boxed = X if scale.lower is None else np.clip(X, scale.lower, scale.upper)
    centred = boxed - scale.center
    norms = np.linalg.norm(centred, axis=1)
    over = norms > scale.radius
    shrink = scale.radius / np.where(over, norms, 1.0)
    clipped = np.where(over[:, None], scale.center + centred * shrink[:, None], boxed)
    return clipped, over | np.any(boxed != X, axis=1)


def public_features(
    X,
    *,
    fit_intercept: bool = True,
    intercept_scaling: float = 0.5,
    scale: PublicScale | None = None,
) -> np.ndarray:
    """The rows the solvers see: x̃ = (clip(x) − m)/D, and with an intercept (√(1 − s²)·x̃, s).

    Args:
        X: (n, d) features.
        fit_intercept: append the constant feature s.
        intercept_scaling: s ∈ (0, 1), the value of the constant feature.
        scale: the public scale (:func:`public_scale`); default ‖x‖ ≤ 1, no bounds.

    Returns:
        (n, d + fit_intercept) float64 rows of norm ≤ 1.
    """
    if scale is None:
        X = clip_rows(X)
    else:
        X = (clip_to_scale(X, scale)[0] - scale.center) / scale.radius
    if not fit_intercept:
        return X
    s = _validate.in_range("intercept_scaling", intercept_scaling, 0.0, 1.0, low_inclusive=False)
    const = np.full((X.shape[0], 1), s)
    return np.hstack([X * math.sqrt(1.0 - s * s), const])


def _kst_sigma(epsilon: float, delta: float) -> float:
    return math.sqrt(8.0 * math.log(2.0 / delta) + 4.0 * epsilon) / epsilon


def default_mu(
    solver: str,
    *,
    n: int,
    d: int,
    epsilon: float,
    delta: float = 0.0,
    radius: float = DEFAULT_RADIUS,
) -> float:
    """The public default μ: a function of (n, d, ε, δ) and the prior radius R only (no data).

    Each balances the noise term of its solver's excess-risk bound (L = 1, ‖x‖ ≤ 1) against the
    regularisation bias μR²/2 (Chaudhuri, Monteleoni, Sarwate 2011, "Differentially private
    empirical risk minimization", https://jmlr.org/papers/v12/chaudhuri11a.html):

    * ``"objective"``: μ = E‖b‖/(nR) with E‖b‖ ≈ σ√d, σ the KST12 scale (δ > 0), or
      E‖b‖ = 2d/ε (CMS11, δ = 0).
    * ``"output"``: μ = √(2B)/R, B = 2σ₁√d/n, σ₁ the Gaussian σ for sensitivity 1 (δ > 0;
      analytic), or σ₁√d replaced by d/ε (the Gamma-norm noise, δ = 0).
    * ``"dp_gd"``: 0 (the convex schedule on the ball of radius R).

    Example:
        >>> round(default_mu("objective", n=1000, d=10, epsilon=1.0, delta=1e-5), 5)
        0.00319
    """
    solver = _validate.one_of("solver", solver, SOLVERS)
    n = _validate.positive_int("n", n)
    d = _validate.positive_int("d", d)
    eps = _validate.epsilon("epsilon", epsilon)
    delta = _validate.delta("delta", 0.0 if delta is None else delta)
    radius = _validate.positive("radius", radius)
    if solver == "dp_gd":
        return 0.0
    if solver == "objective":
        mean_norm = _kst_sigma(eps, delta) * math.sqrt(d) if delta > 0 else 2.0 * d / eps
        return mean_norm / (n * radius)
    if delta > 0:
        from dpjax.mechanisms import analytic_gaussian_sigma

        unit = analytic_gaussian_sigma(sensitivity=1.0, epsilon=eps, delta=delta) * math.sqrt(d)
    else:
        unit = d / eps
    return math.sqrt(2.0 * 2.0 * unit / n) / radius


def _check_key(random_state):
    """The PRNG key of a fit: a JAX key (typed or raw uint32[2]); an int only for research."""
    if random_state is None:
        raise ValueError(
            "random_state must be a JAX PRNG key (e.g. jax.random.key(seed)); got None: dpjax "
            "never draws privacy noise from a default key. For a real release use a key "
            "from the OS: random_state=dpjax.os_key()"
        )
    if isinstance(random_state, bool):
        _validate.fail("random_state", random_state, "a JAX PRNG key or an int seed")
    if isinstance(random_state, int | np.integer):
        return jax.random.key(int(random_state))  # research only (documented)
    if isinstance(random_state, jax.Array):
        if jnp.issubdtype(random_state.dtype, jax.dtypes.prng_key) and random_state.shape == ():
            return random_state
        if random_state.dtype == jnp.uint32 and random_state.shape == (2,):
            return jax.random.wrap_key_data(random_state)
    _validate.fail("random_state", random_state, "a JAX PRNG key (scalar) or an int seed")


def _key_fingerprint(key) -> bytes:
    return np.asarray(jax.random.key_data(key)).tobytes()


class PrivateLogisticRegression(_Mixin, _Base):
    """Differentially private binary logistic regression with scikit-learn conventions.

    Fits w minimising (1/n)Σ log(1 + exp(−y_i⟨w, x̃_i⟩)) + (μ/2)‖w‖² privately, where x̃_i is
    the public row map of :func:`public_features` (clip to the public ``bounds`` and
    ``data_norm``, centre, divide by D; with an intercept, scale by √(1 − s²) and append s).
    ``coef_`` and ``intercept_`` are on the scale of the ORIGINAL features, applied to the
    clipped row: decision(x) = ⟨coef_, clip(x)⟩ + intercept_ with clip of
    :func:`clip_to_scale` (the identity on rows inside the stated scale).

    State the scale of the features: ``data_norm`` (a public bound on ‖x‖) and/or ``bounds``
    (public per-feature ranges), known WITHOUT looking at the data (from the measurement
    device, the data dictionary, a public data set). Choosing them from the training data
    leaks it. Without either, rows are clipped to ‖x‖ ≤ 1 with a :class:`PrivacyLeakWarning`.

    Args:
        epsilon: ε > 0.
        delta: δ ∈ [0, 1). δ = 0 (default, like diffprivlib) selects the pure-ε variants:
            ``"objective"`` → CMS11 Algorithm 2 tilt plus gamma-norm output noise for the
            solver's residual, ``"output"`` → CMS11 Algorithm 1 (Gamma-norm noise); δ > 0
            selects KST12 objective perturbation (plus Gaussian output noise for the residual)
            and Gaussian output perturbation. ``"dp_gd"`` needs δ > 0. A δ ≥ 1/n warns.
        mu: μ ≥ 0 (public); ``None`` → :func:`default_mu` (a function of n, d, ε, δ and
            ``radius``, never of the data values). Objective/output need μ > 0.
        solver: ``"objective"``, ``"output"`` or ``"dp_gd"``.
        fit_intercept: learn an intercept through the constant feature s (counted in the norm).
        intercept_scaling: s ∈ (0, 1), default 0.5.
        radius: R > 0, the public prior on ‖w*‖ (default μ; DP-GD's projection radius).
        max_steps: cap on DP-GD's T (default ⌈n²ρ/(2d)⌉, capped at this); public.
        random_state: a JAX PRNG key (required: there is no default key). An ``int`` seed is
            accepted for RESEARCH ONLY — not for real releases (threefry keys from small
            integers are guessable): for a real release pass ``dpjax.os_key()``. Each fit
            draws its noise from this key: refitting with the same key reuses the noise (a
            warning); pass a fresh key (``set_params(random_state=...)``) for every release.
        classes: the two class labels, if public (recommended). ``None``: read from y and
            released as they are, with a :class:`PrivacyLeakWarning` (as diffprivlib does).
        data_norm: D > 0, a public bound on the row norm ‖x − m‖ (m: the centre of
            ``bounds``, else 0); rows beyond it are scaled back onto it. Default: the
            half-diagonal of ``bounds``, or 1 (with a warning) when ``bounds`` is None too.
        bounds: ``(lower, upper)`` public per-feature ranges (scalars or (d,) arrays,
            lower < upper); each feature is clipped into its range, then centred.

    Attributes:
        coef_: (1, d) weights; intercept_: (1,); classes_: the two labels (sorted);
            n_features_in_: d; mu_: the μ used; event_: the privacy event of the release;
            result_: the underlying :class:`dpjax.erm.ERMResult`; scale_: the
            :class:`PublicScale` used.
        clipped_fraction_: the fraction of training rows the public scale moved (box or norm
            clipping). NOT private: a statistic of the data for the data holder, to check the
            stated scale — do not publish it. Near 0: the scale fits; near 1: the stated scale
            is far too small and the model learns little.

    Warns:
        PrivacyLeakWarning: neither ``data_norm`` nor ``bounds`` given; labels read from y
            (no ``classes``); δ ≥ 1/n (a mechanism that publishes one random record in full
            is (0, 1/n)-DP, so such a δ permits it).

    Formal guarantees:
        Replace-one (the relation CMS11 / KST12 and the argmin-sensitivity lemma prove).
        The row map is applied to each record independently and the label map is fixed by the
        two class labels, so neighbouring data stay neighbouring. ``"objective"``:
        :func:`dpjax.erm.approximate_objective_perturbation` — the tilt at 0.99ε (CMS11
        Theorem 9 for δ = 0, KST12 Theorem 2 for δ > 0; L = 1 and φ'' ≤ 1/4 of the logistic
        loss with ‖x̃‖ ≤ 1), the accelerated solve to τ = 1e-9/μ' of the exact tilted
        minimiser, and output noise at 0.01ε for the residual 2τ (gamma-norm for δ = 0, so the
        RELEASED coefficients are ε-DP, not only the exact minimiser: the step count of the
        solve jumps with ‖b‖ and, without that noise, skips outputs differently on D and D′);
        ``"output"``: argmin sensitivity
        2/(μn) (CMS11 Corollary 8), then
        CMS11 Theorem 6 (δ = 0) or the analytic Gaussian mechanism (Balle & Wang 2018);
        ``"dp_gd"``: T Gaussian mechanisms on a clipped gradient sum of sensitivity 2, composed
        in zCDP (Bun & Steinke 2016, "Concentrated differential privacy",
        https://arxiv.org/abs/1605.02065). The class labels ``classes_`` are those
        given in ``classes`` (public); without ``classes`` they are read from y and released
        as they are (as in scikit-learn/diffprivlib), outside the guarantee,
        with a warning. n is treated as public.

    Example:
        >>> import jax, numpy as np
        >>> from dpjax.erm import PrivateLogisticRegression
        >>> X = np.array([[1.0, 0.2], [0.9, 0.1], [-1.0, 0.0], [-0.8, -0.3]])
        >>> y = ["a", "a", "b", "b"]
        >>> clf = PrivateLogisticRegression(epsilon=1.0, classes=["a", "b"], bounds=(-2.0, 2.0),
        ...                                 random_state=jax.random.key(0)).fit(X, y)
        >>> clf.predict(X).shape, clf.classes_.tolist(), clf.clipped_fraction_
        ((4,), ['a', 'b'], 0.0)
    """

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        delta: float = 0.0,
        mu: float | None = None,
        solver: str = "objective",
        fit_intercept: bool = True,
        intercept_scaling: float = 0.5,
        radius: float = DEFAULT_RADIUS,
        max_steps: int = 1000,
        random_state=None,
        classes=None,
        data_norm=None,
        bounds=None,
    ):
        self.epsilon = epsilon
        self.delta = delta
        self.mu = mu
        self.solver = solver
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.radius = radius
        self.max_steps = max_steps
        self.random_state = random_state
        self.classes = classes
        self.data_norm = data_norm
        self.bounds = bounds

    # -- scikit-learn tags: binary only, randomised (determinism needs a fixed key) -------------
    def _more_tags(self):
        return {"binary_only": True, "non_deterministic": False, "requires_y": True}

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    # -- input handling ---------------------------------------------------------------------------
    def _validate_X(self, X, *, reset: bool, y=None):
        if _HAVE_SKLEARN:
            from sklearn.utils.validation import check_array, check_X_y

            if y is not None:
                X, y = check_X_y(X, y, dtype=np.float64, y_numeric=False)
            else:
                X = check_array(X, dtype=np.float64)
        else:
            X = np.asarray(X, dtype=np.float64)
            if X.ndim != 2:
                _validate.fail("X", f"shape {X.shape}", "a 2-d array (n_samples, n_features)")
            if not np.all(np.isfinite(X)):
                _validate.fail("X", "non-finite entries", "finite (Input contains NaN or inf)")
            if y is not None:
                y = np.asarray(y)
                if y.shape != (X.shape[0],):
                    _validate.fail("y", f"shape {y.shape}", f"shape ({X.shape[0]},)")
        if reset:
            self.n_features_in_ = X.shape[1]
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but PrivateLogisticRegression is expecting "
                f"{self.n_features_in_} features as input"
            )
        return X, y

    def _check_params(self, n: int, d: int) -> dict:
        eps = _validate.epsilon("epsilon", self.epsilon)
        delta = _validate.delta("delta", 0.0 if self.delta is None else self.delta)
        solver = _validate.one_of("solver", self.solver, SOLVERS)
        radius = _validate.positive("radius", self.radius)
        if solver == "dp_gd" and not delta > 0:
            _validate.fail("delta", self.delta, "in (0, 1) for solver='dp_gd' (zCDP → (ε, δ))")
        if self.mu is None:
            mu = default_mu(solver, n=n, d=d, epsilon=eps, delta=delta, radius=radius)
        elif solver == "dp_gd":
            mu = _validate.non_negative("mu", self.mu)
        else:
            mu = _validate.positive("mu", self.mu)
        steps = _validate.positive_int("max_steps", self.max_steps)
        if delta >= 1.0 / n:
            warnings.warn(
                f"PrivateLogisticRegression: delta = {delta:g} ≥ 1/n = 1/{n}: a mechanism that "
                "publishes one random record in full is (0, 1/n)-DP, so this δ does not rule "
                f"it out. Choose δ ≪ 1/n (e.g. ≤ 1/n² = {1.0 / n**2:.3g}), or δ = 0.",
                PrivacyLeakWarning,
                stacklevel=3,
            )
        return dict(epsilon=eps, delta=delta, solver=solver, radius=radius, mu=mu, steps=steps)

    # -- fit / predict ----------------------------------------------------------------------------
    def _public_classes(self, y) -> np.ndarray:
        """The two labels: ``classes`` if given (public), else read from y with a warning."""
        if self.classes is not None:
            classes = np.unique(np.asarray(self.classes))
            if classes.size != 2:
                _validate.fail("classes", self.classes, "two distinct labels")
            unknown = ~np.isin(y, classes)
            if np.any(unknown):
                _validate.fail("y", f"labels outside classes={classes.tolist()!r}", "in classes")
            return classes
        classes = np.unique(y)
        if classes.size != 2:
            raise ValueError(
                f"y must hold exactly 2 classes for PrivateLogisticRegression (binary only); "
                f"got {classes.size} class(es): {classes[:5].tolist()!r}"
            )
        warnings.warn(
            "PrivateLogisticRegression.fit: classes_ is read from y and released as it is (not "
            "private: whether a label occurs depends on the data); pass classes=[a, b] when the "
            "two labels are public.",
            PrivacyLeakWarning,
            stacklevel=3,
        )
        return classes

    def fit(self, X, y):
        """Fit privately on (X, y); y must hold exactly two distinct labels (or ``classes``).

        Returns:
            self.
        """
        if y is None:
            raise ValueError(
                "y must be an array of labels: PrivateLogisticRegression requires y to be "
                "passed, but the target y is None"
            )
        X, y = self._validate_X(X, reset=True, y=y)
        if _HAVE_SKLEARN:
            from sklearn.utils.multiclass import check_classification_targets

            check_classification_targets(y)  # "Unknown label type" for continuous targets
        classes = self._public_classes(y)
        key = _check_key(self.random_state)
        fingerprint = _key_fingerprint(key)
        if getattr(self, "_last_key_", None) == fingerprint:
            warnings.warn(
                "PrivateLogisticRegression.fit: random_state is the key of the previous fit; "
                "the noise is reused (two releases with the same noise can cancel it). Pass a "
                "fresh key for every release.",
                UserWarning,
                stacklevel=2,
            )
        signs = np.where(y == classes[1], 1.0, -1.0)
        scale = self._public_scale(X.shape[1])
        _, changed = clip_to_scale(X, scale)
        rows = public_features(
            X,
            fit_intercept=self.fit_intercept,
            intercept_scaling=self.intercept_scaling,
            scale=scale,
        )
        params = self._check_params(*rows.shape)
        with jax.enable_x64(True):
            result = _solve(key, rows, signs, params)
            w = np.asarray(result.params, dtype=np.float64)
        self._last_key_ = fingerprint
        self.classes_ = classes
        self.mu_ = params["mu"]
        self.result_ = result
        self.event_ = result.event
        self.scale_ = scale
        self.clipped_fraction_ = float(np.mean(changed))  # NOT private (data holder only)
        self._set_coefficients(w, scale)
        return self

    def _public_scale(self, d: int) -> PublicScale:
        """The public scale from ``data_norm``/``bounds``; a warning when neither is stated."""
        if self.data_norm is None and self.bounds is None:
            warnings.warn(
                "PrivateLogisticRegression.fit: neither data_norm nor bounds given, so every "
                "row is clipped to ‖x‖ ≤ 1. Features on another scale are then mostly clipped "
                "and the model can collapse to the majority class. State the PUBLIC scale "
                "(data_norm=bound on ‖x‖, or bounds=(lower, upper) per feature), known without "
                "looking at the data: choosing it from the training data leaks the data. "
                "clipped_fraction_ tells you (not privately) how many rows were clipped.",
                PrivacyLeakWarning,
                stacklevel=3,
            )
        return public_scale(d, data_norm=self.data_norm, bounds=self.bounds)

    def _set_coefficients(self, w: np.ndarray, scale: PublicScale) -> None:
        """coef_, intercept_ on the original features: ⟨w, (x − m)/D⟩ = ⟨w/D, x⟩ − ⟨w/D, m⟩."""
        if self.fit_intercept:
            s = float(self.intercept_scaling)
            coef = w[:-1] * math.sqrt(1.0 - s * s) / scale.radius
            intercept = w[-1] * s
        else:
            coef, intercept = w / scale.radius, 0.0
        self.coef_ = coef[None, :]
        self.intercept_ = np.array([intercept - float(coef @ scale.center)])

    def _check_fitted(self):
        if not hasattr(self, "coef_"):
            try:
                from sklearn.exceptions import NotFittedError
            except ImportError:  # pragma: no cover
                NotFittedError = AttributeError  # noqa: N806
            raise NotFittedError(
                "This PrivateLogisticRegression instance is not fitted yet. Call 'fit' first."
            )

    def decision_function(self, X) -> np.ndarray:
        """⟨coef_, clip(x)⟩ + intercept_, clip the fit's public map (:func:`clip_to_scale`);
        shape (n,)."""
        self._check_fitted()
        X, _ = self._validate_X(X, reset=False)
        return clip_to_scale(X, self.scale_)[0] @ self.coef_[0] + self.intercept_[0]

    def predict_proba(self, X) -> np.ndarray:
        """(n, 2) probabilities of ``classes_[0]`` and ``classes_[1]`` under the logistic model."""
        z = self.decision_function(X)
        # σ(±z), each side computed directly (1 − σ(z) cancels when σ(z) ≈ 1)
        return np.column_stack([special.expit(-z), special.expit(z)])

    def predict_log_proba(self, X) -> np.ndarray:
        """Log of :meth:`predict_proba`, computed stably."""
        z = self.decision_function(X)
        return np.column_stack([-np.logaddexp(0.0, z), -np.logaddexp(0.0, -z)])

    def predict(self, X) -> np.ndarray:
        """The label of the larger probability (``classes_[1]`` when the decision is > 0)."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(int)]


def _solve(key, rows: np.ndarray, signs: np.ndarray, p: dict):
    """Run the chosen dpjax.erm solver in float64 (the caller holds ``enable_x64``)."""
    from dpjax.accounting import zcdp_rho_for_epsilon
    from dpjax.erm.iterative import default_steps, dp_gd
    from dpjax.erm.losses import logistic
    from dpjax.erm.objective_perturbation import approximate_objective_perturbation
    from dpjax.erm.output_perturbation import output_perturbation

    X, y = jnp.asarray(rows), jnp.asarray(signs)
    pure = p["delta"] == 0.0
    common = dict(loss=logistic, epsilon=p["epsilon"])
    if p["solver"] == "objective":  # the released iterate is covered (see the guarantees)
        variant = "cms" if pure else "kst"
        delta = None if pure else p["delta"]
        return approximate_objective_perturbation(
            key, X, y, mu=p["mu"], delta=delta, variant=variant, **common
        )
    if p["solver"] == "output":
        variant = "cms" if pure else "gaussian"
        return output_perturbation(
            key, X, y, mu=p["mu"], delta=p["delta"], variant=variant, **common
        )
    n, d = rows.shape
    rho = zcdp_rho_for_epsilon(epsilon=p["epsilon"], delta=p["delta"])
    steps = min(default_steps(n=n, d=d, rho=rho), p["steps"])
    return dp_gd(key, X, y, mu=p["mu"], delta=p["delta"], radius=p["radius"], steps=steps, **common)
