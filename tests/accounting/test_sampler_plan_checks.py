"""Bad inputs to the with-replacement accounting and samplers are refused by name."""

import pytest

from dpjax.accounting.with_replacement import with_replacement_epsilon
from dpjax.dp_sgd.samplers import WithReplacementSampler


@pytest.mark.parametrize("vdi", [-1e-3, 0.0, float("nan"), float("inf")])
def test_with_replacement_epsilon_refuses_nonpositive_discretization(vdi):
    with pytest.raises(ValueError, match="value_discretization_interval"):
        with_replacement_epsilon(
            noise_multiplier=1.0,
            batch_size=4,
            dataset_size=100,
            steps=10,
            delta=1e-5,
            value_discretization_interval=vdi,
        )


def test_with_replacement_sampler_refuses_dataset_beyond_int32_indices():
    with pytest.raises(ValueError, match="dataset_size"):
        WithReplacementSampler(dataset_size=2**33, batch_size=4)
    assert WithReplacementSampler(dataset_size=2**31 - 1, batch_size=4).dataset_size == 2**31 - 1
