"""zCDP (ρ of the Gaussian, composition, both conversions) and the DP-GD recipes of the lecture
on ML under DP."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from dpjax import accounting as acc
from dpjax.mechanisms import gaussian_epsilon


def test_gaussian_rho_and_composition_hand_computed():
    # ρ = Δ²/(2σ²): Δ = 1, σ = 2 → 1/8; Δ = 2C/n with C = 1, n = 100, σ = 0.01 → 200.
    assert acc.gaussian_zcdp_rho(sigma=2.0, sensitivity=1.0) == 0.125
    assert acc.gaussian_zcdp_rho(sigma=0.01, sensitivity=0.02) == pytest.approx(2.0)
    assert acc.zcdp_compose([0.125] * 8) == pytest.approx(1.0)


def test_bun_steinke_conversion_hand_computed():
    # ρ + 2√(ρ ln(1/δ)): ρ = 0.01, δ = 1e-5 → 0.01 + 2·√(0.1151293) = 0.688614.
    assert acc.zcdp_epsilon_bun_steinke(rho=0.01, delta=1e-5) == pytest.approx(0.688614, abs=1e-6)
    assert acc.zcdp_epsilon(rho=0.01, delta=1e-5, conversion="bun_steinke") == pytest.approx(
        0.688614, abs=1e-6
    )


@pytest.mark.parametrize("rho", [1e-5, 1e-3, 0.05, 1.0, 30.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_cks_conversion_tighter_than_bun_steinke_and_matches_dense_rdp(rho, delta):
    cks = acc.zcdp_epsilon_cks(rho=rho, delta=delta)
    assert cks <= acc.zcdp_epsilon_bun_steinke(rho=rho, delta=delta)
    # dp-accounting converts RDP by the same CKS formula on a grid of orders: with a dense grid
    # it can only be above our continuous minimum, and close to it.
    orders = np.exp(np.linspace(np.log(1.0 + 1e-4), np.log(1e7), 4000))
    accountant = rdp.RdpAccountant(orders=list(orders))
    accountant.compose(dp_accounting.ZCDpEvent(rho))
    dense = accountant.get_epsilon(delta)
    assert cks <= dense + 1e-9
    assert cks == pytest.approx(dense, rel=2e-3, abs=1e-6)


def test_zcdp_of_gaussian_is_never_below_exact_gaussian_epsilon():
    # A valid conversion cannot beat the exact Balle–Wang ε of the same Gaussian.
    for sigma in [0.8, 2.0, 10.0]:
        rho = acc.gaussian_zcdp_rho(sigma=sigma, sensitivity=1.0)
        exact = gaussian_epsilon(sigma=sigma, sensitivity=1.0, delta=1e-5)
        assert acc.zcdp_epsilon_cks(rho=rho, delta=1e-5) >= exact


@pytest.mark.parametrize("conversion", ["cks", "bun_steinke"])
def test_rho_for_epsilon_round_trip(conversion):
    for eps in [0.1, 1.0, 8.0]:
        rho = acc.zcdp_rho_for_epsilon(epsilon=eps, delta=1e-5, conversion=conversion)
        back = acc.zcdp_epsilon(rho=rho, delta=1e-5, conversion=conversion)
        assert back <= eps * (1 + 1e-12)
        assert back == pytest.approx(eps, rel=1e-6)


def test_dpgd_zcdp_recipe_closed_form():
    # σ = Δ√(T/(2ρ)), ρ = (√(ln 1/δ + ε) − √(ln 1/δ))²: ε = 1, δ = 1e-5 → ρ = 0.0208199;
    # T = 100, Δ = 1 → σ = √(100/0.0416399) = 49.0056.
    sigma = acc.dpgd_sigma_zcdp(epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0)
    assert sigma == pytest.approx(49.0056, abs=1e-3)
    # The recipe's σ really gives (ε, δ): T Gaussians with σ = one Gaussian with σ/√T.
    exact = gaussian_epsilon(sigma=sigma / 10.0, sensitivity=1.0, delta=1e-5)
    assert exact <= 1.0
    tighter = acc.dpgd_sigma_zcdp(
        epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0, conversion="cks"
    )
    assert tighter < sigma


def test_dpgd_advanced_recipe_meets_budget_and_is_looser_than_tight_accounting():
    eps0, delta0 = acc.advanced_composition_step_budget(epsilon=1.0, delta=1e-5, steps=100)
    assert delta0 == pytest.approx(1e-5 / 200)
    total, dlt = acc.advanced_composition(epsilon=eps0, delta=delta0, steps=100, delta_prime=0.5e-5)
    assert total <= 1.0 and total == pytest.approx(1.0, rel=1e-9)
    assert dlt == pytest.approx(1e-5)
    sigma = acc.dpgd_sigma_advanced(epsilon=1.0, delta=1e-5, steps=100, sensitivity=0.5)
    # Classic Gaussian: σ = Δ√(2 ln(1.25/δ₀))/ε₀.
    assert sigma == pytest.approx(0.5 * math.sqrt(2 * math.log(1.25 / delta0)) / eps0)
    # Tight accounting (PLD, q = 1) needs much less noise; zCDP sits in between.
    tight = acc.calibrate_noise_multiplier(
        target_epsilon=1.0, delta=1e-5, sampling_rate=1.0, steps=100
    )
    zcdp = acc.dpgd_sigma_zcdp(epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0)
    assert tight < zcdp < sigma / 0.5


def test_recipe_validation():
    with pytest.raises(ValueError, match="epsilon"):
        acc.dpgd_sigma_advanced(epsilon=-1.0, delta=1e-5, steps=10, sensitivity=1.0)
    with pytest.raises(ValueError, match="delta"):
        acc.dpgd_sigma_zcdp(epsilon=1.0, delta=0.0, steps=10, sensitivity=1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        acc.dpgd_sigma_zcdp(epsilon=1.0, delta=1e-5, steps=10, sensitivity=0.0)
    with pytest.raises(ValueError, match="steps"):
        acc.dpgd_sigma_advanced(epsilon=1.0, delta=1e-5, steps=0, sensitivity=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        # one step at ε = 20 needs ε₀ ≈ 3.5: the classic calibration refuses ε₀ ≥ 1
        acc.dpgd_sigma_advanced(epsilon=20.0, delta=1e-5, steps=1, sensitivity=1.0)
    with pytest.raises(ValueError, match="rho"):
        acc.zcdp_epsilon(rho=0.0, delta=1e-5)
    with pytest.raises(ValueError, match="conversion"):
        acc.zcdp_epsilon(rho=1.0, delta=1e-5, conversion="naive")
    with pytest.raises(ValueError, match="rhos"):
        acc.zcdp_compose([])
