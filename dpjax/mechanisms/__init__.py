"""Noise mechanisms of the lectures: each ``name(key, value, *, ...)`` plus its calibration."""

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

__all__ = [
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "laplace",
    "laplace_expected_l1_error",
    "laplace_linf_tail_bound",
    "laplace_scale",
]
