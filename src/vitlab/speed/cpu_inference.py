"""Inference on CPU with every Linear's weight prepared once instead of on every call.

nn.Linear hands its weight to the matrix-multiply library on every call, which first reorders it into
its blocked layout; under `torch.autocast("cpu", torch.bfloat16)` it is also cast to bf16 first:
ViT-B/16 moves its 86M weights once or twice per forward pass before any arithmetic.
`pack_for_cpu_inference` does that once, with the operators torch's own compiler uses for this
(inductor's weight prepacking: `torch.ops.mkldnn._reorder_linear_weight` and `_linear_pointwise`,
oneDNN). In bf16 the product is the same oneDNN kernel with bf16 inputs and outputs, so the logits
are bitwise autocast's; in fp32 oneDNN's kernel replaces MKL's, the same to ~1e-6 (both tested).
Measured on one core of the development VM with `vitlab bench --against timm` (see the README):
ViT-B/16 and ViT-S/16 inference runs 1.13-1.28x as fast as timm's same model, in fp32 and in bf16.

For inference only: a packed model has no Linear weights to train, and its state_dict is not a
checkpoint. Everything else (LayerNorm, softmax, GELU) runs as before, under autocast for bf16.
"""

from __future__ import annotations

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def supported(precision: str = "fp32", device: torch.device | str = "cpu") -> bool:
    """Whether this torch build has oneDNN on this device (and, for bf16, its bf16 kernels: AVX512-BF16 or AMX)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return precision == "fp32" or (precision == "bf16" and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T + b with W (cast to `dtype` and) reordered for oneDNN once (see the module docstring)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, tokens_hint: int | None = None):
        super().__init__()
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, dtype
        weight = linear.weight.detach().to(dtype)  # (out, in)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, tokens_hint))
        self.register_buffer("bias", linear.bias.detach().to(dtype) if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.dtype}, packed"


def pack_for_cpu_inference(model: nn.Module, precision: str = "fp32", tokens_hint: int | None = None) -> nn.Module:
    """Replace every nn.Linear of `model` (in place) by a PackedLinear; returns `model`, in eval mode.
    Run a bf16-packed model under bf16 autocast, as before.

    `tokens_hint`: the rows a product will usually see (batch x tokens), which lets oneDNN pick the
    layout; None lets it choose. Raises if oneDNN cannot do it here (check `supported()` first).
    """
    if not supported(precision):
        raise RuntimeError(f"no oneDNN {precision} kernels in this CPU or torch build: run the model unpacked")
    model.eval()
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child, DTYPES[precision], tokens_hint))
        else:
            pack_for_cpu_inference(child, precision, tokens_hint)
    return model
