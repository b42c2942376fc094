"""Noise mechanisms of differential privacy: each ``name(key, value, *, ...)`` plus its calibration.

Every release is guarded against ``jax.vmap`` key sharing: a vmap that batches the values
(``value``, ``scores``, ``counts``, ``data``, ``values``) needs one distinct key per row, else
``ValueError`` naming ``key`` (under ``jit``, repeated keys void the release); see the
mechanisms guide.
"""

from dpjax.mechanisms.bounded_laplace import (
    bounded_laplace,
    bounded_laplace_delta_c,
    bounded_laplace_epsilon,
    bounded_laplace_scale,
)
from dpjax.mechanisms.counts import consistent_counts, noisy_counts, noisy_counts_event
from dpjax.mechanisms.discrete import discrete_laplace as discrete_laplace
from dpjax.mechanisms.discrete import discrete_laplace_rate
from dpjax.mechanisms.discrete_gaussian import (
    discrete_gaussian,
    discrete_gaussian_delta,
    discrete_gaussian_epsilon,
    discrete_gaussian_pmf,
    discrete_gaussian_rho,
)
from dpjax.mechanisms.exponential import (
    exponential_mechanism,
    exponential_mechanism_expected_gap_bound,
    exponential_mechanism_probabilities,
    exponential_mechanism_scale,
    exponential_mechanism_utility_bound,
    report_noisy_max,
    report_noisy_max_scale,
)
from dpjax.mechanisms.gaussian import (
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_sigma,
)
from dpjax.mechanisms.laplace import (
    laplace,
    laplace_expected_l1_error,
    laplace_linf_tail_bound,
    laplace_scale,
)
from dpjax.mechanisms.mixed_noise import (
    MixedNoiseScale,
    mixed_noise,
    mixed_noise_lecture_delta,
    mixed_noise_scale,
    mixed_noise_threshold,
)
from dpjax.mechanisms.randomized_response import (
    COIN_EPSILON,
    coin_randomized_response,
    randomized_response,
    randomized_response_epsilon,
    randomized_response_frequencies,
    randomized_response_keep_probability,
)
from dpjax.mechanisms.sensitivity import (
    clip_into_range,
    mean_sensitivity,
    median_sensitivity,
    variance_sensitivity,
)
from dpjax.mechanisms.smooth_sensitivity import (
    SmoothNoise,
    heavy_tailed_noise,
    heavy_tailed_privacy_loss,
    local_sensitivity_median,
    smooth_laplace_delta,
    smooth_median,
    smooth_noise_parameters,
    smooth_sensitivity_median,
)
from dpjax.mechanisms.subsample_aggregate import (
    clipped_mean,
    clipped_mean_sensitivity,
    subsample_and_aggregate,
)

__all__ = [
    "COIN_EPSILON",
    "MixedNoiseScale",
    "SmoothNoise",
    "analytic_gaussian_sigma",
    "bounded_laplace",
    "bounded_laplace_delta_c",
    "bounded_laplace_epsilon",
    "bounded_laplace_scale",
    "classic_gaussian_sigma",
    "clip_into_range",
    "clipped_mean",
    "clipped_mean_sensitivity",
    "coin_randomized_response",
    "consistent_counts",
    "discrete_gaussian",
    "discrete_gaussian_delta",
    "discrete_gaussian_epsilon",
    "discrete_gaussian_pmf",
    "discrete_gaussian_rho",
    "discrete_laplace",
    "discrete_laplace_rate",
    "exponential_mechanism",
    "exponential_mechanism_expected_gap_bound",
    "exponential_mechanism_probabilities",
    "exponential_mechanism_scale",
    "exponential_mechanism_utility_bound",
    "gaussian",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "heavy_tailed_noise",
    "heavy_tailed_privacy_loss",
    "laplace",
    "laplace_expected_l1_error",
    "laplace_linf_tail_bound",
    "laplace_scale",
    "local_sensitivity_median",
    "mean_sensitivity",
    "median_sensitivity",
    "mixed_noise",
    "mixed_noise_lecture_delta",
    "mixed_noise_scale",
    "mixed_noise_threshold",
    "noisy_counts",
    "noisy_counts_event",
    "randomized_response",
    "randomized_response_epsilon",
    "randomized_response_frequencies",
    "randomized_response_keep_probability",
    "report_noisy_max",
    "report_noisy_max_scale",
    "smooth_laplace_delta",
    "smooth_median",
    "smooth_noise_parameters",
    "smooth_sensitivity_median",
    "subsample_and_aggregate",
    "variance_sensitivity",
]
