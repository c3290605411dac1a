"""Inference with the Linear weights packed once for oneDNN, for the CPUs where that is faster.

On x86, torch hands an fp32 `nn.Linear` to Intel's MKL, which reorders the weight into its blocked
layout at every call. On AMD processors MKL runs far below the CPU's rate: on an AMD EPYC with AVX-512
(Zen 5), ViT-S/16's inference ran 2.5x faster with its Linear weights packed once for oneDNN, which
does not look at the vendor (`docs/speed.md` has the figures). torch has no public switch for it, and
`torch.compile`'s freezing packs fp32 weights for MKL on x86, so this module calls the oneDNN
operators inductor itself uses for bf16 weights:

    torch.ops.mkldnn._reorder_linear_weight(W, rows)    W (out, in) in oneDNN's blocked layout
    torch.ops.mkldnn._linear_pointwise(x, W', b, ...)   x W^T + b, optionally GELU in the same kernel

These are private operators, so they are used only where `available()` says this build has them,
and only where `vitlab.speed.rules` sends a CPU kind (with its measured gain in `docs/speed.md`);
everywhere else the model runs its own `nn.Linear`, the public fallback.

`packed_copy` returns a copy of the model whose Linear weights are reordered (and, in bf16, cast) once,
so no call reorders or casts a weight again; a ViT MLP's GELU runs inside fc1's kernel. The model
given is not changed. The results agree with torch's products to float rounding (tested). For
inference only: training changes the weights every step, and reordering them at every call (as an
earlier vitlab did) made a ViT-S/16 training step only 2-4% faster on the same AMD EPYC, below what
a private operator must earn here.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitlab.models.vit import Mlp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def available(precision: str = "fp32") -> bool:
    """Whether this torch build has oneDNN's CPU operators (and, for bf16, bf16 kernels on this CPU)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    return precision == "fp32" or (precision == "bf16" and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T + b with W cast to `dtype` and reordered once for oneDNN (for `rows` rows; other row counts
    are computed right too); with `gelu` ("none" for the exact GELU, "tanh" for its approximation),
    GELU(y) in the same kernel."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, rows: int | None = None, gelu: str | None = None):
        super().__init__()
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, dtype
        self.post_op, self.algorithm = ("gelu", gelu) if gelu is not None else ("none", "")
        weight = linear.weight.detach().to(dtype)  # (out, in)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, rows))
        self.register_buffer("bias", linear.bias.detach().to(dtype) if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.packed_weight, self.bias, self.post_op, [], self.algorithm
        )

    def extra_repr(self) -> str:
        fused = f", then GELU ({self.algorithm})" if self.post_op == "gelu" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self.dtype}, packed for oneDNN{fused}"
        )


def _gelu_after(parent: nn.Module, name: str) -> str | None:
    """The GELU variant that directly follows the Linear `parent.<name>` in a ViT MLP in eval mode (fc1, then
    its act with an inactive dropout between), else None."""
    act, drop = getattr(parent, "act", None), getattr(parent, "drop1", None)
    if isinstance(parent, Mlp) and name == "fc1" and isinstance(act, nn.GELU) and not (drop.training and drop.p):
        return act.approximate
    return None


def packed_copy(model: nn.Module, precision: str, rows: int | None = None) -> nn.Module:
    """A copy of `model` in eval mode with every nn.Linear packed for oneDNN in `precision` (for `rows` rows per
    product, batch x tokens; None: any). For inference only: a packed copy has no Linear weights to train.
    Run a bf16 copy under bf16 autocast, as the model: its products are then bitwise autocast's."""
    packed = copy.deepcopy(model).eval()
    for parent in list(packed.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                gelu = _gelu_after(parent, name)
                setattr(parent, name, PackedLinear(child, DTYPES[precision], rows, gelu))
                if gelu is not None:
                    parent.act = nn.Identity()  # applied inside fc1's kernel now
    return packed


__all__ = ["available", "PackedLinear", "packed_copy"]
