"""A `Plan` put to work: the module that runs inference on it, and the context that trains on it. Neither
changes the model it is given: inference runs a copy whenever the plan changes anything, and training
restores what it set (the attention kernel) when its context ends, and swaps no module.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

from torch import nn

from vitlab.models.vit import VisionTransformer
from vitlab.speed import onednn
from vitlab.speed.compiled import CompiledModel, in_pieces
from vitlab.speed.rules import AS_BUILT, Plan


def tokens(model: nn.Module) -> int:
    """Rows of a product per image: the ViT's tokens (1 for a CNN)."""
    cfg = getattr(model, "cfg", None)
    return cfg.num_patches + cfg.num_prefix_tokens if hasattr(cfg, "num_patches") else 1


def family(model: nn.Module) -> str:
    """The kind of model the rules tell apart (`vitlab.speed.rules.FAMILIES`): "vit" for a VisionTransformer, a
    hybrid's conv stem included, "cnn" for anything else."""
    return "vit" if isinstance(model, VisionTransformer) else "cnn"


def is_vit_on_cpu(model: nn.Module) -> bool:
    return isinstance(model, VisionTransformer) and next(model.parameters()).device.type == "cpu"


def usable(plan: Plan | None, model: nn.Module, precision: str, mode: str = "inference") -> Plan:
    """`plan` less what cannot run for `model` here: its own choices only apply to a ViT on the CPU, and oneDNN's
    packed products to inference in a torch build that has them (the public fallback: torch's own). None: the
    model as built."""
    if plan is None:
        return AS_BUILT
    if not is_vit_on_cpu(model):
        return Plan(compile=plan.compile, source=plan.source)
    if plan.products == "onednn" and (mode == "train" or not onednn.available(precision)):
        why = "oneDNN's products are for inference" if mode == "train" else "no oneDNN here"
        return Plan(plan.attention, "aten", plan.compile, plan.pieces, f"{plan.source}; {why}")
    return plan


def inference_fn(
    model: nn.Module, plan: Plan | None, *, precision: str, batch_size: int, method: str = "forward"
) -> Callable:
    """`model.<method>` on `plan`'s path, for batches of `batch_size`: the model itself when the plan changes
    nothing (or is None), else a copy with the plan's attention kernel and products, compiled (with freezing) if it says
    so, run `plan.pieces` images at a time (a copy is in eval mode; the model itself is called as it is). Call
    it under `torch.inference_mode()` and the precision's autocast, as the model."""
    plan = usable(plan, model, precision)
    if plan == AS_BUILT:
        return getattr(model, method)
    rows = (plan.pieces or batch_size) * tokens(model)
    ready = onednn.packed_copy(model, precision, rows) if plan.products == "onednn" else copy.deepcopy(model).eval()
    if isinstance(ready, VisionTransformer):
        ready.set_fused_attention(plan.attention == "fused")
    fn = CompiledModel(ready, mode="inference", method=method) if plan.compile else getattr(ready, method)
    return fn if not plan.pieces else (lambda x, *args, **kwargs: in_pieces(fn, x, plan.pieces, *args, **kwargs))


@contextlib.contextmanager
def training(model: nn.Module, plan: Plan | None, *, precision: str) -> Iterator[nn.Module]:
    """Train `model` on `plan`'s path (None: as built) inside the context: yields the module to call (the model,
    or its compiled graph, which shares its parameters), with the plan's attention kernel, set back to what it
    was when the context ends. Training takes torch's own products (`vitlab.speed.onednn` is for inference)."""
    plan = usable(plan, model, precision, mode="train")
    fused = [b.attn.fused for b in model.blocks] if isinstance(model, VisionTransformer) else None
    if fused is not None:
        model.set_fused_attention(plan.attention == "fused")
    try:
        yield CompiledModel(model, mode="train") if plan.compile else model
    finally:
        if fused is not None:
            for block, was in zip(model.blocks, fused):
                block.attn.fused = was


__all__ = ["inference_fn", "training", "usable", "tokens", "is_vit_on_cpu", "family"]
