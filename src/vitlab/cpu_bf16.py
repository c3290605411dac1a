"""bf16 inference on CPU with every Linear's weight prepared once instead of on every call.

Under `torch.autocast("cpu", torch.bfloat16)` each nn.Linear call casts its fp32 weight to bf16 and
oneDNN then reorders it into its blocked (VNNI) layout before the product: ViT-B/16 moves its 86M
weights twice per forward pass. `pack_for_bf16_inference` does both once, with the operator torch's
own compiler uses for this (inductor's weight prepacking, `torch.ops.mkldnn._linear_pointwise`).
The product is the same oneDNN bf16 kernel with bf16 inputs and outputs, so the logits are bitwise
those of autocast (tested). Measured on one AVX512-BF16 core: ViT-B/16 batch 1 1.18x, batch 32
1.10x; ViT-S/16 1.07-1.08x (`vitlab bench --precision bf16`).

For inference only: a packed model has no Linear weights to train, and its state_dict is not a
checkpoint. Everything else (LayerNorm, softmax, GELU) still runs under autocast as before.
"""

from __future__ import annotations

import torch
from torch import nn


def supported(device: torch.device | str = "cpu") -> bool:
    """Whether this CPU build of torch has oneDNN with bf16 kernels (AVX512-BF16 or AMX)."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T + b in bf16, W cast and reordered for oneDNN once (see the module docstring)."""

    def __init__(self, linear: nn.Linear, tokens_hint: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16)  # (out, in)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, tokens_hint))
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out), bf16
        return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 packed"


def pack_for_bf16_inference(model: nn.Module, tokens_hint: int | None = None) -> nn.Module:
    """Replace every nn.Linear of `model` (in place) by a PackedLinear; returns `model`, in eval mode.

    `tokens_hint`: the rows a product will usually see (batch x tokens), which lets oneDNN pick the
    layout; None lets it choose. Raises if this CPU has no oneDNN bf16 kernels (check `supported()`).
    """
    if not supported():
        raise RuntimeError("this CPU or torch build has no oneDNN bf16 kernels; run bf16 under plain autocast")
    model.eval()
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child, tokens_hint))
        else:
            pack_for_bf16_inference(child, tokens_hint)
    return model
