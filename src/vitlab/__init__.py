"""vitlab: the Vision Transformer paper (Dosovitskiy et al. 2020), runnable.

The public API:
    create_model, model_names, get_config      the one door to a model (vitlab.models)
    ViTConfig, VisionTransformer, PretrainedCfg the paper's model and the weights' provenance
    fit, Recipe, RECIPES                       the one training engine and its recipes (vitlab.train)
    attention_maps, attention_rollout          what the model attends to (vitlab.analysis)
    VitlabError                                the one error type for user mistakes

Each name is loaded from its module on first use (PEP 562): `import vitlab` itself imports nothing
heavy, so the command line starts inside its own Ctrl-C guard (vitlab.cli.run).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for readers and tools (type checkers, the API docs); at run time each name loads on first use
    from vitlab.analysis.attention import attention_maps, attention_rollout
    from vitlab.errors import VitlabError
    from vitlab.models.factory import create_model
    from vitlab.models.pretrained_cfg import PretrainedCfg
    from vitlab.models.registry import VARIANTS, get_config, model_names
    from vitlab.models.vit import VisionTransformer, ViTConfig, count_parameters
    from vitlab.train.engine import fit
    from vitlab.train.recipe import RECIPES, Recipe

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    "VitlabError": "vitlab.errors",
    "attention_maps": "vitlab.analysis.attention",
    "attention_rollout": "vitlab.analysis.attention",
    "ViTConfig": "vitlab.models.vit",
    "VisionTransformer": "vitlab.models.vit",
    "count_parameters": "vitlab.models.vit",
    "PretrainedCfg": "vitlab.models.pretrained_cfg",
    "create_model": "vitlab.models.factory",
    "get_config": "vitlab.models.registry",
    "model_names": "vitlab.models.registry",
    "VARIANTS": "vitlab.models.registry",
    "fit": "vitlab.train.engine",
    "Recipe": "vitlab.train.recipe",
    "RECIPES": "vitlab.train.recipe",
}


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value  # once loaded, an ordinary attribute
        return value
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


__all__ = [*_API, "__version__"]
