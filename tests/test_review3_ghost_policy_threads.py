"""Review 3 (adversarial): the ghost policy forced in one thread must not leak into another.

ghost_clipped_pairs reads the policy twice: once for the summation depth (the clip shrink f)
and once, through keyed_jit, for the program it runs (and, while tracing, the budgets of every
layer). With a process-global stack of forced policies, a thread that forces ACCELERATOR
(``_ghost_policy.use``, e.g. an A/B benchmark or a test runner thread) changes what another
thread reads between those two reads: a CPU program (more streamed merges: deeper sums) could
run with ACCELERATOR's shallower depth, i.e. a clip shrink too small for its rounding, or a
program traced with one thread's budgets could be cached under the other's key.
"""

import threading

from dpjax.dp_sgd import _ghost_policy


def _policy_seen_while_other_thread_forces(policy):
    entered, release = threading.Event(), threading.Event()

    def other():
        with _ghost_policy.use(policy):
            entered.set()
            release.wait(5.0)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert entered.wait(5.0)
        return _ghost_policy.current()
    finally:
        release.set()
        thread.join()


def test_policy_forced_in_another_thread_is_not_seen_here():
    baseline = _ghost_policy.current()
    accelerator, cpu = _ghost_policy.ACCELERATOR, _ghost_policy.CPU
    other = accelerator if baseline != accelerator else cpu
    assert _policy_seen_while_other_thread_forces(other) == baseline


def test_policy_forced_here_is_kept_while_another_thread_forces_another():
    with _ghost_policy.use(_ghost_policy.CPU):
        seen = _policy_seen_while_other_thread_forces(_ghost_policy.ACCELERATOR)
        assert seen == _ghost_policy.CPU
        assert _ghost_policy.current() == _ghost_policy.CPU
