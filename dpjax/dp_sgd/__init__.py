"""DP-SGD: per-example clipping, Poisson sampling, noise and optimizers, in one place.

The pieces compose as an optax pipeline (Abadi et al. 2016, "Deep learning with differential
privacy", Algorithm 1, https://arxiv.org/abs/1607.00133):

    sampler (Poisson, padded)  ->  clipped_grad (gather + mask, per-example clip, sum)  ->
    add_gaussian_noise (once, σC)  ->  normalize_by (public expected batch size)  ->  optimizer

σ and C are stated once: ``dp_sgd_optimizer(clipped_grad=grad_fn, noise_multiplier=σ, ...)``
reads C from ``grad_fn``, and ``event_for(tx, sampler=..., state=...)`` reads σ from ``tx``.

Modules: ``samplers`` (Poisson / shuffled / uniform batches with a fixed padded shape),
``balls_in_bins`` (balls-in-bins / random allocation batches, padded),
``clipping`` (per-example clipped sums, certified against rounding), ``ghost`` (ghost clipping:
norms without per-example gradients; its certified bounds and sums in ``_ghost_bounds`` and
``_ghost_sums``), ``transforms`` (noise and normalisation as optax ``GradientTransformation``s,
the Laplace DP-SGD noise), ``optimizers`` (``dp_sgd_optimizer``, gradient accumulation, Laplace
DP-SGD), ``distributed`` (data parallel over a device mesh), ``sharded`` (parameters sharded
over a mesh's model axis, FSDP-style, noise drawn shard by shard), ``user_level`` (user-level
DP-SGD: ``make_private(..., user_ids=...)``), ``adaptive_clip`` (adaptive clipping, Andrew et
al. 2021: C follows a quantile of the norms), ``norm_layers`` (``replace_batch_norm``: GroupNorm
in place of BatchNorm in a flax nnx model), ``finetune`` (full, LoRA, bias-only, last-layer
fine-tuning).

Two sub-packages ("rooms"): ``training`` (``make_private``: the one-call path built from these,
the training object and its loop, its states, the plan ledger and ε spent; ``private`` is its
former single module, kept as a re-export) and ``matrix_factorization`` (correlated noise:
strategies, their errors and sensitivity, streaming noise, ``BandMF``).

Why only these two: each holds a workflow with its own internal layers (eight and eleven
modules) that the rest of ``dp_sgd`` does not reach into. Clipping, noise and sampling are one
or two public modules each, imported by every other part of DP-SGD and by tests through their
present paths; folders for them would add re-export shims and move nothing a reader needs to
find. Revisit when one of them grows past a few modules.
"""

from dpjax.dp_sgd import private  # noqa: F401 (dpjax.dp_sgd.private.<name> still resolves)
from dpjax.dp_sgd.adaptive_clip import (
    AdaptiveClip,
    AdaptiveClipState,
    accounted_noise_multiplier,
    effective_noise_multiplier,
)
from dpjax.dp_sgd.balls_in_bins import BallsInBinsSampler
from dpjax.dp_sgd.clipping import ClippedGrad, ClippingInfo, clip_pytree, clipped_grad
from dpjax.dp_sgd.distributed import DataParallelClippedGrad, data_parallel, replicate
from dpjax.dp_sgd.matrix_factorization.config import BandMF, CyclicPoissonSampler
from dpjax.dp_sgd.matrix_factorization.streaming import correlated_noise
from dpjax.dp_sgd.norm_layers import replace_batch_norm
from dpjax.dp_sgd.optimizers import (
    AccumulationState,
    DPSGDTransformation,
    accumulate_clipped_sums,
    dp_sgd_optimizer,
    event_for,
    laplace_dp_sgd_event,
    laplace_dp_sgd_optimizer,
    noise_releases,
)
from dpjax.dp_sgd.samplers import (
    PaddedBatch,
    PoissonSampler,
    ShuffledBatchSampler,
    UniformBatchSampler,
    WithReplacementSampler,
)
from dpjax.dp_sgd.sharded import (
    MeshLayout,
    ShardedClippedGrad,
    add_sharded_gaussian_noise,
    mesh_layout,
    sharded_clipped_grad,
)
from dpjax.dp_sgd.training import (
    Callback,
    Checkpoint,
    CSVLogger,
    EarlyStopping,
    Evaluate,
    FitRun,
    PrivateState,
    PrivateTraining,
    PublicState,
    make_private,
    nnx_loss,
    poisson_schedule,
    restore_checkpoint,
)
from dpjax.dp_sgd.training import ledger as _plan  # noqa: F401 (former path of the ledger)
from dpjax.dp_sgd.transforms import (
    PublicNoiseState,
    add_gaussian_noise,
    add_laplace_dp_sgd_noise,
    normalize_by,
    public_opt_state,
)
from dpjax.dp_sgd.user_level import (
    UserGrouping,
    UserLevelTraining,
    clipped_user_sum,
    group_users,
)

__all__ = [
    "BallsInBinsSampler",
    "AccumulationState",
    "AdaptiveClip",
    "AdaptiveClipState",
    "BandMF",
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "CyclicPoissonSampler",
    "ClippedGrad",
    "ClippingInfo",
    "DPSGDTransformation",
    "DataParallelClippedGrad",
    "EarlyStopping",
    "Evaluate",
    "FitRun",
    "MeshLayout",
    "PaddedBatch",
    "PoissonSampler",
    "PrivateState",
    "PrivateTraining",
    "PublicNoiseState",
    "PublicState",
    "ShardedClippedGrad",
    "ShuffledBatchSampler",
    "UniformBatchSampler",
    "UserGrouping",
    "UserLevelTraining",
    "WithReplacementSampler",
    "accounted_noise_multiplier",
    "accumulate_clipped_sums",
    "add_gaussian_noise",
    "add_laplace_dp_sgd_noise",
    "add_sharded_gaussian_noise",
    "clip_pytree",
    "clipped_grad",
    "clipped_user_sum",
    "correlated_noise",
    "data_parallel",
    "dp_sgd_optimizer",
    "effective_noise_multiplier",
    "event_for",
    "group_users",
    "laplace_dp_sgd_optimizer",
    "laplace_dp_sgd_event",
    "make_private",
    "mesh_layout",
    "nnx_loss",
    "noise_releases",
    "normalize_by",
    "poisson_schedule",
    "public_opt_state",
    "replace_batch_norm",
    "replicate",
    "restore_checkpoint",
    "sharded_clipped_grad",
]
