"""PrivacyAccountant: heterogeneous events, method applicability, relations, release counts."""

import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from dpjax import accounting as acc
from dpjax.mechanisms import gaussian_epsilon


def test_gaussian_and_laplace_events_match_dp_accounting_composed_directly():
    events = [
        acc.GaussianEvent(noise_multiplier=4.0, count=3, relation="add_or_remove_one"),
        acc.LaplaceEvent(noise_multiplier=5.0, count=2, relation="add_or_remove_one"),
        acc.PoissonSampledGaussianEvent(noise_multiplier=1.5, sampling_rate=0.05, count=20),
    ]
    accountant = acc.PrivacyAccountant(events)
    composed = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(4.0), 3),
            dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(5.0), 2),
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.5)),
                20,
            ),
        ]
    )
    add = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    p = pld.PLDAccountant(add, 1e-4)
    p.compose(composed)
    r = rdp.RdpAccountant(list(acc.DEFAULT_RDP_ORDERS), add)
    r.compose(composed)
    assert accountant.epsilon(1e-5, accounting="pld") == pytest.approx(
        p.get_epsilon(1e-5), rel=1e-3
    )
    assert accountant.epsilon(1e-5, accounting="rdp") == pytest.approx(
        r.get_epsilon(1e-5), rel=1e-9
    )
    assert accountant.applicable_methods() == ("pld", "rdp")
    assert accountant.epsilon(1e-5) == pytest.approx(accountant.epsilon(1e-5, accounting="pld"))
    assert accountant.releases == 25


def test_gaussian_only_accountant_offers_zcdp_and_picks_the_tightest():
    accountant = acc.PrivacyAccountant([acc.GaussianEvent(noise_multiplier=2.0, count=4)])
    assert accountant.relation is acc.GaussianEvent(1.0).relation
    eps = accountant.epsilons(1e-6)
    assert set(eps) == {"pld", "rdp", "zcdp"}
    # 4 releases at σ/Δ = 2 = one at 1; exact ε from Balle–Wang, zCDP ρ = 4/(2·4) = 0.5.
    exact = gaussian_epsilon(sigma=1.0, sensitivity=1.0, delta=1e-6)
    assert eps["pld"] == pytest.approx(exact, rel=1e-4)
    assert eps["zcdp"] == pytest.approx(acc.zcdp_epsilon_cks(rho=0.5, delta=1e-6))
    assert eps["pld"] <= eps["rdp"] <= eps["zcdp"] * (1 + 1e-6)
    assert accountant.epsilon(1e-6) == min(eps.values())


def test_generic_events_use_composition_theorems_and_refuse_pld():
    accountant = acc.PrivacyAccountant()
    accountant.record(acc.EpsilonDeltaEvent(epsilon=0.1, delta=1e-7, count=100))
    assert accountant.applicable_methods() == ("optimal", "advanced", "basic")
    with pytest.raises(ValueError, match="pld"):
        accountant.epsilon(1e-5, accounting="pld")
    with pytest.raises(ValueError, match="rdp"):
        accountant.epsilon(1e-5, accounting="rdp")
    with pytest.raises(ValueError, match="zcdp"):
        accountant.epsilon(1e-5, accounting="zcdp")
    basic = accountant.epsilon(1e-5, accounting="basic")
    assert basic == pytest.approx(10.0)
    adv = accountant.epsilon(2e-5, accounting="advanced")
    ref, _ = acc.advanced_composition(epsilon=0.1, delta=1e-7, steps=100, delta_prime=1e-5)
    assert adv == pytest.approx(ref)
    opt = accountant.epsilon(2e-5, accounting="optimal")
    assert opt == pytest.approx(
        acc.optimal_composition_epsilon(epsilon=0.1, delta=1e-7, steps=100, delta_total=2e-5)
    )
    assert accountant.epsilon(2e-5) == opt <= adv
    # δ below the events' own Σδᵢ = 1e-5: no finite ε.
    assert accountant.epsilon(5e-6, accounting="basic") == math.inf
    assert accountant.epsilon(9e-6, accounting="advanced") == math.inf


def test_heterogeneous_pure_events_refuse_optimal_but_compose():
    dpsgd_event = acc.LaplaceDPSGDEvent(epsilons=(0.5, 0.25, 0.125))
    accountant = acc.PrivacyAccountant(
        [dpsgd_event, acc.EpsilonDeltaEvent(epsilon=0.3, relation="replace_one")]
    )
    assert accountant.releases == 4
    assert "optimal" not in accountant.applicable_methods()
    with pytest.raises(ValueError, match="identical"):
        accountant.epsilon(1e-6, accounting="optimal")
    assert accountant.epsilon(0.0, accounting="basic") == pytest.approx(1.175)
    # zCDP of pure DP: ρ = Σ ε²/2.
    rho = (0.25 + 0.0625 + 0.015625 + 0.09) / 2
    assert accountant.epsilon(1e-6, accounting="zcdp") == pytest.approx(
        acc.zcdp_epsilon_cks(rho=rho, delta=1e-6)
    )
    assert accountant.epsilon(1e-6) <= 1.175


def test_laplace_event_is_pure_dp_for_every_method():
    accountant = acc.PrivacyAccountant([acc.LaplaceEvent(noise_multiplier=2.0, count=3)])
    assert accountant.epsilon(0.0, accounting="basic") == pytest.approx(1.5)
    assert accountant.epsilon(0.0, accounting="optimal") == pytest.approx(1.5)
    # PLD of 3 Laplace releases: at most 3Δ/b = 1.5 (up to discretisation) at any δ.
    assert accountant.epsilon(1e-9, accounting="pld") <= 1.5 + 1e-3
    assert accountant.epsilon(1e-3) < 1.5


def test_mixed_relations_are_refused():
    accountant = acc.PrivacyAccountant([acc.GaussianEvent(noise_multiplier=1.0)])
    with pytest.raises(ValueError, match="relation"):
        accountant.record(acc.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.1))
    with pytest.raises(ValueError, match="relation"):
        acc.PrivacyAccountant(relation="add_or_remove_one").record(acc.LaplaceEvent(1.0))
    with pytest.raises(ValueError, match="events"):
        acc.rdp_epsilon(
            [
                acc.GaussianEvent(1.0, relation="replace_one"),
                acc.GaussianEvent(1.0, relation="add_or_remove_one"),
            ],
            1e-5,
        )
    with pytest.raises(ValueError, match="event"):
        accountant.record("not an event")


def test_replace_one_poisson_event_pld_only():
    event = acc.PoissonSampledGaussianEvent(
        noise_multiplier=1.0, sampling_rate=0.05, count=10, relation="replace_one"
    )
    accountant = acc.PrivacyAccountant([event])
    assert accountant.applicable_methods() == ("pld",)
    with pytest.raises(ValueError, match="replace-one"):
        accountant.epsilon(1e-5, accounting="rdp")
    assert accountant.epsilon(1e-5) == pytest.approx(
        acc.dp_sgd_epsilon(
            noise_multiplier=1.0,
            sampling_rate=0.05,
            steps=10,
            delta=1e-5,
            relation="replace_one",
        )
    )


def test_independent_fixed_batch_events_rdp_amplified_with_other_releases():
    fixed = acc.FixedBatchGaussianEvent(
        noise_multiplier=2.0, batch_size=50, dataset_size=1000, count=40, sampling="independent"
    )
    gauss = acc.GaussianEvent(noise_multiplier=10.0, count=2)  # replace-one sensitivity units
    accountant = acc.PrivacyAccountant([fixed, gauss])
    assert accountant.applicable_methods() == ("pld", "rdp", "zcdp")
    # Direct: dp-accounting RDP under replace-one, base Gaussian σ/(2C) = 1.
    replace = dp_accounting.NeighboringRelation.REPLACE_ONE
    r = rdp.RdpAccountant(list(acc.DEFAULT_RDP_ORDERS), replace)
    r.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                1000, 50, dp_accounting.GaussianDpEvent(1.0)
            ),
            40,
        )
    )
    r.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(10.0), 2))
    amplified = accountant.epsilon(1e-5, accounting="rdp")
    assert amplified == pytest.approx(r.get_epsilon(1e-5), rel=1e-9)
    # PLD has no amplification for it: 40 + 2 Gaussian releases, far looser.
    assert accountant.epsilon(1e-5, accounting="pld") > 2 * amplified
    assert accountant.epsilon(1e-5) == amplified


def test_shuffled_fixed_batch_events_count_epochs_not_steps():
    # 45 steps, ⌊1000/100⌋ = 10 batches per epoch: a record is in ≤ 5 batches.
    shuffled = acc.FixedBatchGaussianEvent(
        noise_multiplier=4.0, batch_size=100, dataset_size=1000, count=45
    )
    accountant = acc.PrivacyAccountant([shuffled])
    exact = gaussian_epsilon(sigma=2.0 / math.sqrt(5), sensitivity=1.0, delta=1e-6)
    assert accountant.epsilon(1e-6, accounting="pld") == pytest.approx(exact, rel=1e-4)
    assert accountant.epsilon(1e-6, accounting="zcdp") == pytest.approx(
        acc.zcdp_epsilon_cks(rho=5 * 4 / (2 * 16.0), delta=1e-6)
    )
    add_fixed = acc.FixedBatchGaussianEvent(
        noise_multiplier=2.0,
        batch_size=50,
        dataset_size=1000,
        relation="add_or_remove_one",
    )
    # The problem is the relation, not a method: refused when recorded, naming the relation
    # and the way out (it used to record, then report "no method applies").
    with pytest.raises(ValueError, match=r"event\.relation must be 'replace_one'"):
        acc.PrivacyAccountant([add_fixed])


def test_full_batch_dpgd_event_zcdp_accounts_relation():
    add = acc.PoissonSampledGaussianEvent(noise_multiplier=4.0, sampling_rate=1.0, count=8)
    rep = acc.PoissonSampledGaussianEvent(
        noise_multiplier=4.0, sampling_rate=1.0, count=8, relation="replace_one"
    )
    rho_add = 8 / (2 * 16.0)
    e_add = acc.PrivacyAccountant([add]).epsilon(1e-5, accounting="zcdp")
    e_rep = acc.PrivacyAccountant([rep]).epsilon(1e-5, accounting="zcdp")
    assert e_add == pytest.approx(acc.zcdp_epsilon_cks(rho=rho_add, delta=1e-5))
    assert e_rep == pytest.approx(acc.zcdp_epsilon_cks(rho=4 * rho_add, delta=1e-5))
    sub = acc.PoissonSampledGaussianEvent(noise_multiplier=4.0, sampling_rate=0.5)
    with pytest.raises(ValueError, match="zcdp"):
        acc.PrivacyAccountant([sub]).epsilon(1e-5, accounting="zcdp")


def test_accountant_validation():
    accountant = acc.PrivacyAccountant([acc.GaussianEvent(1.0)])
    with pytest.raises(ValueError, match="delta"):
        accountant.epsilon(1.0)
    with pytest.raises(ValueError, match="accounting"):
        accountant.epsilon(1e-5, accounting="gdp")
    with pytest.raises(ValueError, match="no events"):
        acc.PrivacyAccountant().epsilon(1e-5, accounting="basic")


def test_fixed_batch_event_sampling_field_is_validated():
    with pytest.raises(ValueError, match="sampling"):
        acc.FixedBatchGaussianEvent(
            noise_multiplier=1.0, batch_size=10, dataset_size=100, sampling="poisson"
        )
    assert acc.FixedBatchGaussianEvent(1.0, 10, 100).sampling == "shuffle"
