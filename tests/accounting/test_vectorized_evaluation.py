"""The array evaluations of dp-accounting's Gaussian PLD and Poisson RDP give dp-accounting's
values bit for bit, and the accountant that uses them reports what dp-accounting reports.

``dpjax.accounting.vectorized`` replaces dp-accounting's per-point Python loops (the inverse
privacy loss of every grid point, the terms of every integer RDP order) by array expressions
of the same operations; the speed is measured by ``python -m benchmarks --accounting``, never
here. These tests pin the values: any drift (a dp-accounting upgrade, a changed formula) fails.
"""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpjax import events as ev
from dpjax.accounting import PrivacyAccountant, tight, vectorized
from dpjax.relation import ADD_OR_REMOVE_ONE

ADD = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE


def _pmfs(p):
    return [p._pmf_remove.to_dense_pmf(), p._pmf_add.to_dense_pmf()]


def _assert_identical(ours, theirs):
    assert ours._symmetric == theirs._symmetric
    for a, b in zip(_pmfs(ours), _pmfs(theirs), strict=True):
        assert a._lower_loss == b._lower_loss
        assert a._infinity_mass == b._infinity_mass
        assert a._probs.shape == b._probs.shape
        assert np.array_equal(a._probs, b._probs)


@pytest.mark.parametrize(
    ("sigma", "q", "vdi", "relation"),
    [
        (1.1, 0.01, 1e-3, ADD),
        (0.63, 256 / 60_000, 1e-3, ADD),
        (0.3, 0.3, 1e-2, ADD),
        (2.0, 0.999, 1e-3, ADD),
        (4.0, 0.01, 1e-4, ADD),
        (1.0, 1.0, 1e-3, ADD),  # q = 1: the Gaussian mechanism
        (1.0, 0.05, 1e-2, REPLACE),  # replace-one: dp-accounting's own inverse
    ],
)
def test_gaussian_pld_is_dp_accountings_bit_for_bit(sigma, q, vdi, relation):
    theirs = pld_lib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=vdi, neighboring_relation=relation
    )
    ours = vectorized.gaussian_pld(
        sigma, sampling_prob=q, value_discretization_interval=vdi, neighboring_relation=relation
    )
    _assert_identical(ours, theirs)


@pytest.mark.parametrize(("sigma", "q", "count"), [(1.1, 0.01, 1000), (0.8, 0.2, 37)])
def test_self_composition_with_shared_bounds_is_dp_accountings(sigma, q, count):
    step = vectorized.gaussian_pld(sigma, sampling_prob=q, value_discretization_interval=1e-3)
    key = ("poisson", sigma, q, ADD_OR_REMOVE_ONE, 1e-3)
    bounds = tight._convolve_bounds(key, count)
    ours = vectorized.self_compose(step, count, 1e-15, bounds)
    _assert_identical(ours, step.self_compose(count, tail_mass_truncation=1e-15))


# Integer orders far apart (the vectorised sums: 2 .. 10⁴ terms) and fractional ones.
ORDERS = (1.5, 2.0, 3.0, 7.25, 12.0, 64.0, 257.0, 1000.0, 10_000.0)


@pytest.mark.parametrize(("sigma", "q"), [(1.1, 0.01), (0.5, 0.2), (20.0, 0.999), (0.63, 1e-4)])
def test_poisson_rdp_is_dp_accountings_bit_for_bit(sigma, q):
    theirs = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, np.array(ORDERS))
    ours = vectorized.poisson_gaussian_rdp(q, sigma, ORDERS)
    assert np.array_equal(ours, theirs)


def test_a_thousand_recorded_steps_report_what_dp_accounting_reports():
    """The accountant path users hit: 1000 one-step records, then ε by PLD and by RDP, against
    dp-accounting composing the same 1000 releases: its PLD pieces (the computation the
    accountant made before the array paths) exactly, its accountants to rounding."""
    sigma, q, delta, vdi = 1.1, 0.01, 1e-5, 1e-3
    acc = PrivacyAccountant(value_discretization_interval=vdi, orders=ORDERS)
    for _ in range(1000):
        acc.record(ev.PoissonSampledGaussianEvent(noise_multiplier=sigma, sampling_rate=q))
    step = pld_lib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=vdi
    )
    pieces = step.self_compose(1000, tail_mass_truncation=1e-15).get_epsilon_for_delta(delta)
    composed = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), 1000
    )
    direct_pld = pld.PLDAccountant(ADD, vdi).compose(composed).get_epsilon(delta)
    direct_rdp = rdp.RdpAccountant(list(ORDERS), ADD).compose(composed).get_epsilon(delta)
    assert acc.epsilon(delta, accounting="pld") == pieces
    assert acc.epsilon(delta, accounting="pld") == pytest.approx(direct_pld, rel=1e-9)
    assert acc.epsilon(delta, accounting="rdp") == direct_rdp
    assert acc.epsilon(delta) == min(pieces, direct_rdp)


def test_vectorised_rdp_reads_an_underflowing_sigma_as_infinite_not_nan():
    # σ² underflows: the terms (i² − i)/2σ² are +inf; dp-accounting's left-to-right log-add
    # meets inf − inf and returns NaN, the array log-add returns +inf (the limit).
    value = vectorized.poisson_gaussian_rdp(0.01, 1e-160, (2.0, 64.0))
    assert np.all(value == math.inf)
