"""torch.compile for vitlab's models, and a batch run a few images at a time.

How a model is compiled (`compile_model`):
- inference: `torch.compile(model, dynamic=False)`, every call run with inductor's `freezing` on
  (`torch._inductor.config.patch(freezing=True)`; `options={"freezing": True}` would reach inductor only,
  after dynamo has handed it the weights as inputs, and nothing would be frozen). Freezing, what
  inductor's documentation recommends for CPU inference, turns the weights into constants, so each
  Linear weight is packed once and the element-wise work around the products (bias, GELU, residual adds,
  LayerNorm) fuses into a few C++ loops; with the C++ wrapper the code calling those kernels is C++ too.
  Run it under `torch.inference_mode()` or `torch.no_grad()`: freezing applies to graphs without gradients;
- training: `torch.compile(model, dynamic=False)`: forward and backward graphs, the weights left as inputs.
`dynamic=False` keeps one graph per batch shape; `CompiledModel` sends a call of another shape (a run's
smaller last batch) to the uncompiled model instead of compiling a second graph.

Inductor keeps the kernels it builds on disk, under vitlab's cache root (`inductor/`, unless
TORCHINDUCTOR_CACHE_DIR says otherwise), so a second process compiles faster. Dynamo keeps at most
`torch._dynamo.config.recompile_limit` graphs per function; a process that compiles many models one after
the other (`vitlab bench`) calls `torch.compiler.reset()` between them.

`in_pieces(fn, x, size)` runs a batch `size` images at a time: at batch 32 a whole batch's activations
(ViT-B/16's MLP hidden layer: 77 MB in fp32) stream through main memory between layers, while a few
images' stay in the cache. Each image meets the same products, so the outputs are the whole batch's to
float rounding (tested).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch
from torch import nn

from vitlab.fileio import cache_root

MODES = ("inference", "train")
LOCK = threading.Lock()  # one compile at a time in a process (a server readies models on several threads)


class _Frozen:
    """A compiled inference function, called with inductor's freezing on (and its C++ wrapper unless
    `cpp_wrapper` is False)."""

    def __init__(self, fn, cpp_wrapper: bool = True):
        self.fn, self.cpp_wrapper = fn, cpp_wrapper

    def __call__(self, *args, **kwargs):
        with torch._inductor.config.patch(freezing=True, cpp_wrapper=self.cpp_wrapper):
            return self.fn(*args, **kwargs)


def compile_model(fn, mode: str, *, cpp_wrapper: bool = True):
    """`fn` (a module's bound method, or any function) compiled for `mode`: "inference" (with freezing) or
    "train" (see the module docstring). `cpp_wrapper=False` compiles as plain `torch.compile` with freezing
    does (`vitlab bench`'s compiled-timm peer). Nothing is compiled until the first call."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; found {mode!r}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    compiled = torch.compile(fn, dynamic=False)
    return _Frozen(compiled, cpp_wrapper) if mode == "inference" else compiled


class CompiledModel(nn.Module):
    """`model` (or its `method`, e.g. "forward_features") and its compiled graph: a call with the batch shape
    of the first call goes to the graph, any other to the uncompiled model. Its parameters are `model`'s, so
    an optimizer can be built on either."""

    def __init__(self, model: nn.Module, *, mode: str, method: str = "forward"):
        super().__init__()
        self.model, self.method = model, method
        self.compiled = compile_model(getattr(model, method), mode)  # a function: `model` is registered once
        self.shape: torch.Size | None = None

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if self.shape is None:
            self.shape = x.shape
            with LOCK:  # the first call compiles
                return self.compiled(x, *args, **kwargs)
        if x.shape == self.shape:
            return self.compiled(x, *args, **kwargs)
        return getattr(self.model, self.method)(x, *args, **kwargs)


def _cat(outputs: list):
    """The outputs of the pieces joined along the batch: tensors, and tuples, lists or dicts of them (e.g.
    `forward_features(x, return_attention=...)`'s (features, [attention per layer]))."""
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
    """`fn(x, *args, **kwargs)`, computed `size` images of `x` at a time (the last piece may be smaller);
    `size` 0 or at least the batch: at once."""
    if not size or x.shape[0] <= size:
        return fn(x, *args, **kwargs)
    return _cat([fn(piece, *args, **kwargs) for piece in x.split(size)])


__all__ = ["CompiledModel", "compile_model", "in_pieces", "LOCK", "MODES"]
