"""vitlab: the Vision Transformer paper (Dosovitskiy et al. 2020), runnable.

The public API: the model (`VisionTransformer`, `ViTConfig`), named variants (`create_model`,
`model_names`), attention maps from the explicit path (`attention_maps`, `attention_rollout`; more
in `vitlab.analysis`), and the one error type (`VitlabError`).
"""

from vitlab.analysis.attention import attention_maps, attention_rollout
from vitlab.errors import VitlabError
from vitlab.model import ViTConfig, VisionTransformer, count_parameters
from vitlab.zoo import VARIANTS, create_model, get_config, model_names

__version__ = "0.1.0"

__all__ = [
    "VitlabError",
    "attention_maps",
    "attention_rollout",
    "ViTConfig",
    "VisionTransformer",
    "count_parameters",
    "create_model",
    "get_config",
    "model_names",
    "VARIANTS",
    "__version__",
]
