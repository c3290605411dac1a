"""vitlab: the Vision Transformer paper (Dosovitskiy et al. 2020), runnable.

The public API:
    create_model, model_names, get_config      the one door to a model (vitlab.models)
    ViTConfig, VisionTransformer, PretrainedCfg the paper's model and the weights' provenance
    fit, Recipe, RECIPES                       the one training engine and its recipes (vitlab.train)
    attention_maps, attention_rollout          what the model attends to (vitlab.analysis)
    VitlabError                                the one error type for user mistakes
"""

from vitlab.analysis.attention import attention_maps, attention_rollout
from vitlab.errors import VitlabError
from vitlab.models.factory import create_model
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.models.registry import VARIANTS, get_config, model_names
from vitlab.models.vit import ViTConfig, VisionTransformer, count_parameters
from vitlab.train.engine import fit
from vitlab.train.recipe import RECIPES, Recipe

__version__ = "0.1.0"

__all__ = [
    "VitlabError",
    "attention_maps",
    "attention_rollout",
    "ViTConfig",
    "VisionTransformer",
    "PretrainedCfg",
    "count_parameters",
    "create_model",
    "get_config",
    "model_names",
    "VARIANTS",
    "fit",
    "Recipe",
    "RECIPES",
    "__version__",
]
