"""Weights: every source's file layout (formats.py), what a checkpoint is and how it fits a model
(pretrained.py), and vitlab's own run checkpoints (checkpoint.py)."""

from vitlab.weights.formats import convert_state_dict, detect_format, read_checkpoint, resolve_source
from vitlab.weights.pretrained import (
    PREPROCESSING,
    Checkpoint,
    PretrainedWarning,
    imagenet_class_names,
    infer_config,
    load_checkpoint,
    plan_load,
    resample_pos_embed,
)

__all__ = [
    "PREPROCESSING",
    "Checkpoint",
    "PretrainedWarning",
    "convert_state_dict",
    "detect_format",
    "imagenet_class_names",
    "infer_config",
    "load_checkpoint",
    "plan_load",
    "read_checkpoint",
    "resample_pos_embed",
    "resolve_source",
]
