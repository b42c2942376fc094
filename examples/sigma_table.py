"""The noise multiplier σ that DP-SGD needs for a target ε, for a few batch sizes and epochs.

Prints the Markdown table of the tuning guide (docs/guides/tuning.md): for a data set of
n = 50,000 examples (CIFAR-10's training set), Poisson sampling at rate q = b/n for
T = epochs · n / b steps, the smallest σ with ε ≤ 1, 3, 8 at δ = 1e-5 (add/remove-one, PLD
accounting: :func:`dpjax.accounting.calibrate_noise_multiplier`), and in brackets σ/b, the
standard deviation of the noise on the AVERAGED clipped gradient in units of C. Run it with
``python -m examples.sigma_table`` (a few minutes on two CPU cores).
"""

from __future__ import annotations

import time

from dpjax.accounting import calibrate_noise_multiplier

N = 50_000
DELTA = 1e-5
TARGETS = (1.0, 3.0, 8.0)
PLANS = ((256, 10), (1024, 10), (4096, 10), (4096, 100), (16384, 100))


def sigma_row(batch_size: int, epochs: int) -> tuple[float, int, list[float]]:
    """(q, T, [σ for each target ε]) of one plan."""
    q = batch_size / N
    steps = round(epochs * N / batch_size)
    sigmas = [
        calibrate_noise_multiplier(target_epsilon=eps, delta=DELTA, sampling_rate=q, steps=steps)
        for eps in TARGETS
    ]
    return q, steps, sigmas


def main() -> None:
    header = " | ".join(f"σ (σ/b) for ε = {eps:g}" for eps in TARGETS)
    print(f"| batch b | epochs | q = b/n | steps T | {header} |")
    print("|" + "---|" * (4 + len(TARGETS)))
    for batch_size, epochs in PLANS:
        start = time.perf_counter()
        q, steps, sigmas = sigma_row(batch_size, epochs)
        cells = " | ".join(f"{s:.2f} ({s / batch_size:.1e})" for s in sigmas)
        print(f"| {batch_size} | {epochs} | {q:.4g} | {steps} | {cells} |", flush=True)
        print(f"<!-- {time.perf_counter() - start:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()
