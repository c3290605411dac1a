"""Seeing inside the model: attention maps, rollout and the paper's Figure 7 analyses (attention.py),
and the figures that show them (plots.py, imported on demand since it pulls in matplotlib)."""

from vitlab.analysis.attention import (
    BoundaryShare,
    attention_distance,
    attention_maps,
    attention_rollout,
    boundary_attention_share,
    cls_attention,
    iter_attention,
    mean_attention_distance,
    patch_embedding_pcs,
    position_embedding_similarity,
    rollout,
    token_map,
)

__all__ = [
    "BoundaryShare",
    "attention_distance",
    "attention_maps",
    "attention_rollout",
    "boundary_attention_share",
    "cls_attention",
    "iter_attention",
    "mean_attention_distance",
    "patch_embedding_pcs",
    "position_embedding_similarity",
    "rollout",
    "token_map",
]
