"""PrivacyAccountant at training scale: O(1) records, cached ε, epsilon_history, state_dict,
relation conversion (group privacy) and the one home of each formula."""

import json
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from dpjax import accounting as acc
from dpjax.accounting import PrivacyAccountant, tight
from dpjax.erm import bounds
from dpjax.events import LaplaceEvent
from dpjax.mechanisms import gaussian_epsilon
from dpjax.mechanisms.gaussian import classic_gaussian_ratio, classic_gaussian_sigma
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, sensitivity_factor

STEP = acc.PoissonSampledGaussianEvent(noise_multiplier=1.1, sampling_rate=0.01)
ADD = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def test_a_thousand_identical_records_are_stored_as_one_event():
    accountant = acc.PrivacyAccountant()
    for _ in range(1000):
        accountant.record(STEP)
    assert len(accountant.events) == 1
    assert accountant.events[0] == acc.PoissonSampledGaussianEvent(
        noise_multiplier=1.1, sampling_rate=0.01, count=1000
    )
    assert accountant.steps == accountant.releases == 1000


def test_merged_records_give_the_epsilon_of_separately_composed_releases():
    # Reference: dp-accounting composing five separate one-step events (no merging anywhere).
    accountant = acc.PrivacyAccountant([STEP] * 5, value_discretization_interval=1e-3)
    assert len(accountant.events) == 1
    one = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    p, r = pld.PLDAccountant(ADD, 1e-3), rdp.RdpAccountant(list(acc.DEFAULT_RDP_ORDERS), ADD)
    for _ in range(5):
        p.compose(one)
        r.compose(one)
    assert accountant.epsilon(1e-5, accounting="rdp") == pytest.approx(
        r.get_epsilon(1e-5), rel=1e-12
    )
    # PLD: one 5-fold self-composition vs five compositions; both pessimistic on a 1e-3 grid.
    assert accountant.epsilon(1e-5, accounting="pld") == pytest.approx(
        p.get_epsilon(1e-5), rel=1e-3
    )


def test_only_consecutive_identical_events_merge():
    other = acc.PoissonSampledGaussianEvent(noise_multiplier=1.1, sampling_rate=0.02)
    accountant = acc.PrivacyAccountant([STEP, STEP, other, STEP])
    assert [e.count for e in accountant.events] == [2, 1, 1]
    assert [e.sampling_rate for e in accountant.events] == [0.01, 0.02, 0.01]


def test_rdp_of_separate_records_is_that_of_one_event():
    # Separate (non-merged) records are grouped inside the evaluator: same RDP as count = 100.
    separate = [STEP, acc.GaussianEvent(4.0, relation="add_or_remove_one")] * 50
    joined = [
        acc.PoissonSampledGaussianEvent(noise_multiplier=1.1, sampling_rate=0.01, count=50),
        acc.GaussianEvent(4.0, count=50, relation="add_or_remove_one"),
    ]
    assert acc.rdp_epsilon(separate, 1e-5) == pytest.approx(
        acc.rdp_epsilon(joined, 1e-5), rel=1e-12
    )
    assert acc.pld_epsilon(separate, 1e-5) == pytest.approx(
        acc.pld_epsilon(joined, 1e-5), rel=1e-12
    )


def test_shuffled_fixed_batch_runs_are_not_merged():
    # Two recorded runs of 5 steps on shuffled batches of 10 per epoch are two permutations: a
    # record can be in one batch of each (2 Gaussian uses of sensitivity 2C), while one 10-step
    # run is one epoch (1 use). Merging them would under-state ε.
    run = acc.FixedBatchGaussianEvent(
        noise_multiplier=2.0, batch_size=10, dataset_size=100, count=5, relation="replace_one"
    )
    accountant = acc.PrivacyAccountant([run, run])
    assert len(accountant.events) == 2
    # Two Gaussian releases with Δ/σ = 2C/(2C) = 1 each: one Gaussian with σ/Δ = 1/√2.
    exact = gaussian_epsilon(sigma=1.0 / math.sqrt(2.0), sensitivity=1.0, delta=1e-6)
    assert accountant.epsilon(1e-6, accounting="pld") == pytest.approx(exact, rel=1e-6)


def test_epsilon_is_cached_per_state_and_refreshed_by_record():
    accountant = acc.PrivacyAccountant([STEP] * 10)
    first = accountant.epsilon(1e-5, accounting="rdp")
    assert accountant.epsilon(1e-5, accounting="rdp") == first
    accountant.record(STEP)
    assert accountant.epsilon(1e-5, accounting="rdp") > first
    fresh = acc.PrivacyAccountant([STEP] * 11).epsilon(1e-5, accounting="rdp")
    assert accountant.epsilon(1e-5, accounting="rdp") == fresh


def _mixed_steps():
    gauss = acc.GaussianEvent(noise_multiplier=3.0, relation="add_or_remove_one")
    other = acc.PoissonSampledGaussianEvent(noise_multiplier=0.9, sampling_rate=0.05)
    return [STEP] * 3 + [gauss] * 2 + [other] * 4 + [STEP]


@pytest.mark.parametrize(("accounting", "rel"), [("rdp", 1e-12), ("pld", 1e-6), (None, 1e-6)])
def test_epsilon_history_equals_per_prefix_epsilon(accounting, rel):
    steps = _mixed_steps()
    accountant = acc.PrivacyAccountant(steps, value_discretization_interval=1e-3)
    history = accountant.epsilon_history(1e-5, every=3, accounting=accounting)
    assert [s for s, _ in history] == [3, 6, 9, 10]
    for s, eps in history:
        prefix = acc.PrivacyAccountant(steps[:s], value_discretization_interval=1e-3)
        reference = prefix.epsilon(1e-5, accounting=accounting)
        assert eps == pytest.approx(reference, rel=rel)
    assert history[-1][1] == pytest.approx(accountant.epsilon(1e-5, accounting), rel=rel)


def test_epsilon_history_of_composition_theorems_and_shuffled_batches():
    laplace = acc.LaplaceEvent(noise_multiplier=4.0, count=7)
    history = acc.PrivacyAccountant([laplace]).epsilon_history(0.0, every=3, accounting="basic")
    assert history == [(3, 0.75), (6, 1.5), (7, 1.75)]
    # A shuffled run split by a checkpoint is accounted as its prefix (⌈s/10⌉ uses), not as
    # a sum over blocks: 15 steps = 2 uses, 10 steps = 1 use.
    run = acc.FixedBatchGaussianEvent(
        noise_multiplier=2.0, batch_size=10, dataset_size=100, count=15, relation="replace_one"
    )
    history = acc.PrivacyAccountant([run]).epsilon_history(1e-6, every=10, accounting="pld")
    one = gaussian_epsilon(sigma=1.0, sensitivity=1.0, delta=1e-6)
    two = gaussian_epsilon(sigma=1.0 / math.sqrt(2.0), sensitivity=1.0, delta=1e-6)
    assert [s for s, _ in history] == [10, 15]
    assert history[0][1] == pytest.approx(one, rel=1e-6)
    assert history[1][1] == pytest.approx(two, rel=1e-6)


def test_epsilon_history_validates_its_arguments():
    accountant = acc.PrivacyAccountant([STEP])
    with pytest.raises(ValueError, match="every"):
        accountant.epsilon_history(1e-5, every=0)
    with pytest.raises(ValueError, match="accounting"):
        accountant.epsilon_history(1e-5, every=1, accounting="basic")
    with pytest.raises(ValueError, match="no events"):
        acc.PrivacyAccountant().epsilon_history(1e-5, every=1, accounting="rdp")


def test_state_dict_round_trips_through_json():
    accountant = acc.PrivacyAccountant(
        [
            acc.GaussianEvent(noise_multiplier=2.0, count=3),
            acc.LaplaceEvent(noise_multiplier=5.0),
            acc.EpsilonDeltaEvent(epsilon=0.1, delta=1e-7, count=4),
            acc.FixedBatchGaussianEvent(
                noise_multiplier=3.0, batch_size=10, dataset_size=50, sampling="independent"
            ),
            acc.LaplaceDPSGDEvent(epsilons=(0.5, 0.25)),
        ],
        value_discretization_interval=1e-3,
        orders=(2.0, 4.0, 8.0, 32.0),
    )
    state = json.loads(json.dumps(accountant.state_dict()))
    again = acc.PrivacyAccountant.from_state_dict(state)
    assert again.events == accountant.events
    assert again.relation is accountant.relation is REPLACE_ONE
    assert again.state_dict() == accountant.state_dict()
    assert again.applicable_methods() == accountant.applicable_methods() == ()
    poisson = acc.PrivacyAccountant([STEP] * 7)
    restored = acc.PrivacyAccountant.from_state_dict(json.loads(json.dumps(poisson.state_dict())))
    assert restored.events == poisson.events
    assert restored.epsilon(1e-5) == poisson.epsilon(1e-5)
    assert acc.PrivacyAccountant.from_state_dict(acc.PrivacyAccountant().state_dict()).steps == 0


def test_state_dict_refuses_foreign_or_broken_input():
    with pytest.raises(ValueError, match="format"):
        acc.PrivacyAccountant.from_state_dict({"events": []})
    good = acc.PrivacyAccountant([STEP]).state_dict()
    bad_type = dict(good, events=[{"type": "SecretEvent", "count": 1}])
    with pytest.raises(ValueError, match="type"):
        acc.PrivacyAccountant.from_state_dict(bad_type)
    negative = dict(good, events=[dict(good["events"][0], noise_multiplier=-1.0)])
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.PrivacyAccountant.from_state_dict(negative)
    extra = dict(good, events=[dict(good["events"][0], clip=1.0)])
    with pytest.raises(ValueError, match="clip"):
        acc.PrivacyAccountant.from_state_dict(extra)


def test_convert_relation_add_remove_to_replace_is_group_privacy_of_two():
    # (2ε, (1 + e^ε)δ), by hand: ε = 0.5, δ = 1e-6 → (1.0, 2.6487212707e-6).
    eps, dlt = acc.convert_relation(
        epsilon=0.5, delta=1e-6, from_="add_or_remove_one", to="replace_one"
    )
    assert eps == 1.0
    assert dlt == pytest.approx(2.6487212707001282e-6, rel=1e-12)
    # Never above Dwork & Roth's k e^{(k−1)ε} δ = 2e^ε δ.
    assert dlt <= 2.0 * math.exp(0.5) * 1e-6
    assert acc.convert_relation(
        epsilon=0.0, delta=1e-6, from_=ADD_OR_REMOVE_ONE, to=REPLACE_ONE
    ) == (0.0, 2e-6)
    same = acc.convert_relation(epsilon=0.7, delta=1e-5, from_="replace_one", to="replace_one")
    assert same == (0.7, 1e-5)


def test_convert_relation_refuses_replace_to_add_remove():
    with pytest.raises(ValueError, match="add_or_remove_one.*n"):
        acc.convert_relation(epsilon=1.0, delta=0.0, from_="replace_one", to="add_or_remove_one")
    with pytest.raises(ValueError, match="to must be one of"):
        acc.convert_relation(epsilon=1.0, delta=0.0, from_="replace_one", to="swap")
    with pytest.raises(ValueError, match="epsilon"):
        acc.convert_relation(epsilon=math.inf, delta=0.0, from_="replace_one", to="replace_one")


def test_add_remove_run_joins_a_replace_one_accountant_through_as_event():
    run = acc.PrivacyAccountant(
        [acc.LaplaceEvent(noise_multiplier=2.0, count=3, relation="add_or_remove_one")]
    )
    release = acc.EpsilonDeltaEvent(epsilon=0.5, relation="replace_one")
    replace = acc.PrivacyAccountant([release])
    with pytest.raises(ValueError, match="as_event"):
        replace.record(run.events[0])
    converted = run.as_event(0.0, relation="replace_one", accounting="basic")
    assert (converted.epsilon, converted.delta, converted.relation) == (3.0, 0.0, REPLACE_ONE)
    replace.record(converted)
    assert replace.epsilon(0.0, accounting="basic") == pytest.approx(3.5)
    # With δ > 0: (2ε, (1 + e^ε)δ) of the run's own ε(δ).
    dpsgd = acc.PrivacyAccountant([STEP] * 20)
    eps = dpsgd.epsilon(1e-6)
    event = dpsgd.as_event(1e-6, relation="replace_one")
    assert event.epsilon == 2.0 * eps
    assert event.delta == pytest.approx((1.0 + math.exp(eps)) * 1e-6, rel=1e-12)
    same = dpsgd.as_event(1e-6)
    assert (same.epsilon, same.delta, same.relation) == (eps, 1e-6, ADD_OR_REMOVE_ONE)
    with pytest.raises(ValueError, match="add_or_remove_one"):
        replace.as_event(0.0, relation="add_or_remove_one", accounting="basic")


def test_sensitivity_factor_is_the_one_replace_one_doubling():
    assert sensitivity_factor("replace_one") == 2.0
    assert sensitivity_factor(ADD_OR_REMOVE_ONE) == 1.0
    with pytest.raises(ValueError, match="relation"):
        sensitivity_factor("swap")
    # Its users: argmin 2L/(μn) vs L/(μn); DP-GD σ = Δ√(T/2ρ) with Δ = 2L/n or L/n.
    rep = bounds.argmin_sensitivity(lipschitz=1.0, mu=0.1, n=100, relation="replace_one")
    add = bounds.argmin_sensitivity(lipschitz=1.0, mu=0.1, n=100, relation="add_or_remove_one")
    assert (rep, add) == pytest.approx((0.2, 0.1), rel=1e-15)


def test_zcdp_gaussian_sigma_is_the_one_home_of_the_dp_gd_calibration():
    # σ = Δ√(T/2ρ), by hand: Δ = 2·1/100, T = 50, ρ = 0.25 → 0.02·√100 = 0.2.
    assert acc.zcdp_gaussian_sigma(rho=0.25, sensitivity=0.02, steps=50) == pytest.approx(0.2)
    assert bounds.dp_gd_sigma(n=100, steps=50, rho=0.25, lipschitz=1.0) == pytest.approx(0.2)
    assert bounds.dp_gd_sigma(
        n=100, steps=50, rho=0.25, lipschitz=1.0, relation="add_or_remove_one"
    ) == pytest.approx(0.1)
    # The recipe: ρ = (√(ln(1/δ) + ε) − √ln(1/δ))² (Bun–Steinke), then the same σ.
    log_term = math.log(1e5)
    rho = (math.sqrt(log_term + 1.0) - math.sqrt(log_term)) ** 2
    assert bounds.rho_from_epsilon_delta(1.0, 1e-5) == pytest.approx(rho, rel=1e-15)
    assert acc.dpgd_sigma_zcdp(
        epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0
    ) == pytest.approx(math.sqrt(100 / (2 * rho)), rel=1e-15)
    assert bounds.epsilon_from_rho(rho, 1e-5) == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(ValueError, match="rho"):
        acc.zcdp_gaussian_sigma(rho=0.0, sensitivity=1.0, steps=1)
    with pytest.raises(ValueError, match="steps"):
        acc.zcdp_gaussian_sigma(rho=1.0, sensitivity=1.0, steps=0)


def test_classic_gaussian_ratio_is_the_one_home_of_the_classic_formula():
    # √(2 ln(1.25/δ))/ε by hand at ε = 0.5, δ = 1e-5: √(2·11.736069)/0.5 = 9.689613.
    assert classic_gaussian_ratio(epsilon=0.5, delta=1e-5) == pytest.approx(9.689613, rel=1e-6)
    assert classic_gaussian_sigma(sensitivity=3.0, epsilon=0.5, delta=1e-5) == pytest.approx(
        3.0 * 9.689613, rel=1e-6
    )
    # The bounds quote the formula beyond ε < 1 (no calibration happens there).
    assert bounds.classic_sigma(sensitivity=1.0, epsilon=2.0, delta=1e-5) == pytest.approx(
        9.689613 / 4.0, rel=1e-6
    )
    with pytest.raises(ValueError, match="epsilon"):
        classic_gaussian_sigma(sensitivity=1.0, epsilon=2.0, delta=1e-5)


def test_incremental_pld_history_stays_an_upper_bound_close_to_direct_composition():
    blocks = [[acc.PoissonSampledGaussianEvent(1.1, 0.01, count=100)]] * 3
    values = tight.pld_epsilons_incremental(blocks, 1e-5)
    direct = [
        acc.pld_epsilon([acc.PoissonSampledGaussianEvent(1.1, 0.01, count=k)], 1e-5)
        for k in (100, 200, 300)
    ]
    assert values == pytest.approx(direct, rel=1e-6)
    assert values[0] < values[1] < values[2]


def test_dp_sgd_functions_take_accounting_and_still_read_the_former_method():
    kwargs = dict(noise_multiplier=3.0, sampling_rate=1.0, steps=10, delta=1e-5)
    rdp_eps = acc.dp_sgd_epsilon(accounting="rdp", **kwargs)
    assert rdp_eps == acc.dp_sgd_epsilon(method="rdp", **kwargs)
    assert rdp_eps > acc.dp_sgd_epsilon(**kwargs) == acc.dp_sgd_epsilon(accounting="pld", **kwargs)
    with pytest.raises(ValueError, match="method"):
        acc.dp_sgd_epsilon(accounting="rdp", method="pld", **kwargs)
    with pytest.raises(ValueError, match="method"):
        acc.calibrate_noise_multiplier(
            target_epsilon=1.0,
            delta=1e-5,
            sampling_rate=1.0,
            steps=10,
            accounting="rdp",
            method="pld",
        )
    assert acc.max_steps(
        noise_multiplier=4.0, target_epsilon=1.0, delta=1e-5, sampling_rate=1.0, accounting="rdp"
    ) == acc.max_steps(
        noise_multiplier=4.0, target_epsilon=1.0, delta=1e-5, sampling_rate=1.0, method="rdp"
    )


# ------------------------------------------------------------------------------------------------
# the DP-SGD training API: each test pins a violation found
# in review and fails without its fix.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- serialisation


def test_state_dict_without_count_is_refused():
    # Before the fix a saved accountant whose event lost "count" came back as ONE release
    # (ε of 1 step instead of 1000), with no error.
    """Catches an accountant state missing an event's count loading with a default count."""
    from dpjax.accounting import PrivacyAccountant
    from dpjax.events import GaussianEvent

    run = PrivacyAccountant([GaussianEvent(4.0, count=1000, relation="add_or_remove_one")])
    state = run.state_dict()
    del state["events"][0]["count"]
    with pytest.raises(ValueError, match="count"):
        PrivacyAccountant.from_state_dict(state)


def test_event_dict_without_relation_is_refused():
    # Before the fix the dict of an add/remove-one Poisson event without "relation" was read
    # back under the class default, and a Gaussian one came back relabelled replace-one.
    """Catches an event dict missing its relation loading with a default relation."""
    from dpjax.events import GaussianEvent, event_from_dict, event_to_dict

    data = event_to_dict(GaussianEvent(4.0, count=3, relation="add_or_remove_one"))
    del data["relation"]
    with pytest.raises(ValueError, match="relation"):
        event_from_dict(data)


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- accountant


def test_accountant_state_with_empty_orders_is_a_clear_error():
    """Catches a state dict with empty RDP orders loading (or crashing) instead of a ValueError."""
    acc = PrivacyAccountant([LaplaceEvent(noise_multiplier=1.0)])
    state = acc.state_dict()
    state["orders"] = []
    with pytest.raises(ValueError, match=r"orders must be a non-empty sequence"):
        PrivacyAccountant.from_state_dict(state)
    with pytest.raises(ValueError, match=r"orders must be a non-empty sequence"):
        PrivacyAccountant(orders=())
