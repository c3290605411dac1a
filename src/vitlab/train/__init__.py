"""Training: the engine (train_one_epoch / evaluate / fit), optimisers and schedules, checkpoints."""

from vitlab.train.engine import TensorLoader, TrainConfig, evaluate, fit, train_one_epoch
from vitlab.train.optim import build_optimizer, param_groups, warmup_cosine

__all__ = [
    "TensorLoader",
    "TrainConfig",
    "evaluate",
    "fit",
    "train_one_epoch",
    "build_optimizer",
    "param_groups",
    "warmup_cosine",
]
