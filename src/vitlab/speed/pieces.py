"""A batch run through the model a few images at a time, when that is faster on this CPU.

A forward pass over a whole batch keeps the whole batch's activations in flight between two layers:
at batch 32, ViT-B/16's MLP hidden layer is 32 x 197 x 3072 floats, 77 MB, far past a core's caches,
so every LayerNorm, GELU, bias and residual sum streams through main memory, and every product reads
its input from there. Run in pieces of a few images, the same layers work on a few MB that stay in
the cache. Each image meets the same products on the same weights, so the outputs are the whole
batch's to float rounding (tested: 1e-5 in fp32).

On an Intel Xeon with AMX (one thread, 32 images, torch 2.14), pieces of 4 ran ViT-S/16 1.13x and
ViT-B/16 1.11x faster than the whole batch in fp32, compiled with freezing, and ViT-S/16 1.24x on
the packed uncompiled model; in bf16, pieces of 8-16 ran ViT-S/16 1.03-1.11x. How much, and at what
size, depends on the CPU's caches and kernels, so the size is measured here (`choose_pieces`): one
encoder block at each candidate size (the batch itself, the default, and the powers of two below it),
scored per image, once per shape, precision and thread count (`vitlab.speed.calibration`).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from vitlab.models.vit import VisionTransformer
from vitlab.runtime import autocast
from vitlab.speed import cpu_inference
from vitlab.speed.calibration import Calibration, calibration, threads_tag


def _cat(outputs: list):
    """The outputs of the pieces, joined along the batch: tensors, and tuples, lists or dicts of them
    (e.g. `forward_features(x, return_attention=...)`'s (features, [attention per layer]))."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(list(parts)) for parts in zip(*outputs))
    if isinstance(first, dict):
        return {k: _cat([o[k] for o in outputs]) for k in first}
    if first is None:
        return None
    raise TypeError(f"cannot join outputs of type {type(first).__name__} along the batch")


def in_pieces(fn: Callable, x: torch.Tensor, size: int, *args, **kwargs):
    """`fn(x, *args, **kwargs)`, computed `size` images of `x` at a time (the last piece may be smaller)."""
    if x.shape[0] <= size:
        return fn(x, *args, **kwargs)
    return _cat([fn(piece, *args, **kwargs) for piece in x.split(size)])


def candidate_sizes(batch_size: int) -> list[int]:
    """The batch itself (the default), then the powers of two below it, largest first."""
    powers = [2**k for k in range(batch_size.bit_length()) if 2**k < batch_size]
    return [batch_size] + powers[::-1]


def choose_pieces(model: nn.Module, *, precision: str, batch_size: int, cal: Calibration | None = None) -> int:
    """How many images of a batch of `batch_size` to run through `model` at a time for inference on this
    CPU: the batch itself unless fewer measured faster here (see the module docstring). The block is timed
    as the model will run it: with the model's attention kernel, and its Linear weights packed (each of the
    kind measured fastest at the whole batch's rows). A model that is not a ViT on the CPU runs whole
    batches."""
    if (not isinstance(model, VisionTransformer) or batch_size <= 1
            or next(model.parameters()).device.type != "cpu"):
        return batch_size
    cal = cal or calibration()
    c = model.cfg
    tokens = c.num_patches + c.num_prefix_tokens
    sizes = candidate_sizes(batch_size)
    key = (f"infer-pieces/{precision}/{threads_tag()}/b{batch_size}xn{tokens}xd{c.dim}xh{c.heads}"
           f"xm{c.hidden_dim}")
    names = [str(s) for s in sizes]
    known = cal.known(key, names)
    if known is not None:
        return int(known)
    block = copy.deepcopy(model.blocks[0]).eval()
    generator = torch.Generator().manual_seed(0)
    candidates = {}
    for size in sizes:
        piece = copy.deepcopy(block)
        if cpu_inference.supported(precision):
            # each Linear of the kind measured fastest at the batch's rows (a measurement the whole batch
            # needs anyway), packed for the piece's: one measurement per layer, not one per candidate
            cpu_inference.pack_for_cpu_inference(piece, precision, size * tokens, cal=cal,
                                                 choose_at=batch_size * tokens)
        z = torch.randn(size, tokens, c.dim, generator=generator)  # (size, p+N, D)

        def run(piece=piece, z=z) -> None:
            with torch.inference_mode(), autocast(torch.device("cpu"), precision):
                piece(z)

        candidates[str(size)] = run
    return int(cal.choose(key, candidates, items=dict(zip(names, sizes))))


__all__ = ["choose_pieces", "in_pieces", "candidate_sizes"]
