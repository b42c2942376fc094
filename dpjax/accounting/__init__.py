"""Privacy accounting: composition theorems, tight DP-SGD accounting, calibration."""

from dpjax.accounting.events import (
    EpsilonDeltaEvent,
    FixedBatchGaussianEvent,
    GaussianEvent,
    LaplaceDPSGDEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
)

__all__ = [
    "EpsilonDeltaEvent",
    "FixedBatchGaussianEvent",
    "GaussianEvent",
    "LaplaceDPSGDEvent",
    "LaplaceEvent",
    "PoissonSampledGaussianEvent",
    "PrivacyEvent",
]
