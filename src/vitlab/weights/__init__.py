"""Weights, one way from a source to a plan: every source's file layout (formats.py), the source read into a
Checkpoint (source.py), the architecture its tensors show (infer.py), the plan of the load (plan.py); and
vitlab's own run checkpoints (checkpoint.py). Nothing here builds a model: `vitlab.create_model` builds it
from the plan."""

from vitlab.models.pretrained_cfg import PREPROCESSING
from vitlab.weights.formats import convert_state_dict, detect_format, read_checkpoint, resolve_source
from vitlab.weights.infer import infer_config
from vitlab.weights.plan import LoadPlan, PretrainedWarning, plan_load, resample_pos_embed
from vitlab.weights.source import Checkpoint, imagenet_class_names, load_checkpoint

__all__ = [
    "PREPROCESSING",
    "Checkpoint",
    "LoadPlan",
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
