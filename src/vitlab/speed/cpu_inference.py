"""Inference on CPU with Linear weights prepared once instead of on every call, where that is faster here.

nn.Linear hands its weight to the matrix-multiply library on every call, which first reorders it into
its blocked layout; under `torch.autocast("cpu", torch.bfloat16)` it is also cast to bf16 first:
ViT-B/16 moves its 86M weights once or twice per forward pass before any arithmetic.
`pack_for_cpu_inference` does that once, with the operators torch's own compiler uses for this
(inductor's weight prepacking, `torch._inductor.fx_passes.mkldnn_fusion`): oneDNN's
(`torch.ops.mkldnn._reorder_linear_weight` and `_linear_pointwise`) and, in fp32, MKL's packed GEMM
(`torch.ops.mkl._mkl_reorder_linear_weight` and `_mkl_linear`, cblas_sgemm_pack). In bf16 the
product is the same oneDNN kernel with bf16 inputs and outputs, so the logits are bitwise autocast's;
in fp32 MKL's packed product is the same arithmetic as nn.Linear's (bitwise on the CPUs measured),
and oneDNN's the same to ~1e-6 (all tested).

Whether it pays depends on the CPU: on an Intel Xeon with AMX a packed bf16 product of ViT-S/16's
shapes ran 2-3.7x autocast's; in fp32, at ViT-B/16's batch-1 shapes (197 rows), MKL packed ran
1.12-1.16x plain and oneDNN 1.07-1.10x, while elsewhere oneDNN and plain were within +-10% of each
other, either way round. So each Linear takes the kind this machine measured fastest at the rows it
will see (`vitlab.speed.calibration`, once per shape, CPU and torch version).

For inference only: a packed model has no Linear weights to train, and its state_dict is not a
checkpoint. Everything else (LayerNorm, softmax, GELU) runs as before, under autocast for bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.models.vit import Mlp
from vitlab.speed.calibration import Calibration, calibration, threads_tag

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LIBRARIES = ("onednn", "mkl")


def supported(precision: str = "fp32", device: torch.device | str = "cpu") -> bool:
    """Whether this torch build has oneDNN on this device (and, for bf16, its bf16 kernels: AVX512-BF16 or AMX)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return precision == "fp32" or (precision == "bf16" and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T + b with W (cast to `dtype` and) reordered once for a library's blocked layout: oneDNN's
    (`library="onednn"`; with `gelu`, "none" for the exact GELU or "tanh" for its approximation, GELU(y)
    in the same kernel) or, in fp32, MKL's packed GEMM (`library="mkl"`, packed for `rows` rows; other row
    counts are computed right too)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, rows: int | None = None, gelu: str | None = None,
                 library: str = "onednn"):
        super().__init__()
        if library not in LIBRARIES or (library == "mkl" and (dtype != torch.float32 or gelu is not None or not rows)):
            raise ValueError(f"PackedLinear: MKL packs fp32 weights for a known row count, without GELU; "
                             f"found library={library!r}, dtype={dtype}, rows={rows}, gelu={gelu!r}")
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, dtype
        self.library, self.rows = library, rows
        self.post_op, self.algorithm = ("gelu", gelu) if gelu is not None else ("none", "")
        weight = linear.weight.detach().to(dtype)  # (out, in)
        if library == "mkl":  # MKL's kernel takes the original weight too (for shapes it did not pack for)
            self.register_buffer("packed_weight", torch.ops.mkl._mkl_reorder_linear_weight(weight, rows))
            self.register_buffer("weight", weight)
        else:
            self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, rows))
        self.register_buffer("bias", linear.bias.detach().to(dtype) if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if self.library == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed_weight, self.weight, self.bias, self.rows)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed_weight, self.bias, self.post_op, [],
                                                  self.algorithm)

    def extra_repr(self) -> str:
        fused = f", then GELU ({self.algorithm})" if self.post_op == "gelu" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.dtype}, "
                f"packed for {'MKL' if self.library == 'mkl' else 'oneDNN'}{fused}")


def mkl_packing_available(precision: str) -> bool:
    """Whether MKL's packed GEMM is a candidate: fp32, in a torch built with MKL."""
    return precision == "fp32" and torch.backends.mkl.is_available()


def fastest_product(linear: nn.Linear, precision: str, rows: int, cal: Calibration, gelu: str | None = None) -> str:
    """Which product is fastest here at `rows` rows: "plain" (nn.Linear's, under autocast for bf16),
    "packed" (oneDNN, GELU fused when `gelu` is given) or, in fp32, "packed-mkl" (MKL's packed GEMM, then
    GELU); with `gelu`, each candidate includes the GELU."""
    fused = f"+gelu-{gelu}" if gelu is not None else ""
    key = f"infer-linear{fused}/{precision}/{threads_tag()}/{rows}x{linear.in_features}x{linear.out_features}"
    names = ["plain", "packed"] + (["packed-mkl"] if mkl_packing_available(precision) else [])
    known = cal.known(key, names)
    if known is not None:
        return known
    dtype = DTYPES[precision]
    x = torch.randn(rows, linear.in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    w, b = linear.weight.detach(), linear.bias.detach() if linear.bias is not None else None
    act = (lambda y: F.gelu(y, approximate=gelu)) if gelu is not None else (lambda y: y)

    def plain() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            act(F.linear(x, w, b))

    onednn = PackedLinear(linear, dtype, rows, gelu)
    candidates = {"plain": plain, "packed": lambda: onednn(x)}
    if "packed-mkl" in names:
        mkl = PackedLinear(linear, dtype, rows, library="mkl")
        candidates["packed-mkl"] = lambda: act(mkl(x))
    return cal.choose(key, candidates)


def _gelu_after(parent: nn.Module, name: str) -> str | None:
    """The GELU variant that directly follows the Linear `parent.<name>` in a ViT MLP (fc1, act, and an
    inactive dropout between: vitlab.models.vit.Mlp in eval mode), else None."""
    act, drop = getattr(parent, "act", None), getattr(parent, "drop1", None)
    if isinstance(parent, Mlp) and name == "fc1" and isinstance(act, nn.GELU) and not (drop.training and drop.p):
        return act.approximate
    return None


def pack_for_cpu_inference(model: nn.Module, precision: str = "fp32", rows: int | None = None, *,
                           measure: bool = True, cal: Calibration | None = None) -> int:
    """Replace (in place) each nn.Linear of `model` by a PackedLinear (oneDNN's or MKL's) where that is
    faster on this machine at `rows` rows per product (batch x tokens), and put `model` in eval mode. A
    ViT MLP's first layer packed for oneDNN takes its GELU into the same kernel (its `act` becomes an
    Identity). Returns how many Linear layers were packed. Run a bf16-packed model under bf16 autocast, as before.

    `measure=False` packs every Linear for oneDNN without asking (the product's layout is then chosen by
    oneDNN for `rows`, or for any rows if None). `cal`: the measurements to use (default: this machine's).
    Raises if oneDNN cannot do it here (check `supported()` first).
    """
    if not supported(precision):
        raise RuntimeError(f"no oneDNN {precision} kernels in this CPU or torch build: run the model unpacked")
    if measure and rows is None:
        raise ValueError("pack_for_cpu_inference: measuring needs rows (batch x tokens per product)")
    cal = cal or calibration()
    model.eval()
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            gelu = _gelu_after(parent, name)
            kind = fastest_product(child, precision, rows, cal, gelu) if measure else "packed"
            if kind == "packed-mkl":
                setattr(parent, name, PackedLinear(child, DTYPES[precision], rows, library="mkl"))
            elif kind == "packed":
                setattr(parent, name, PackedLinear(child, DTYPES[precision], rows, gelu))
                if gelu is not None:
                    parent.act = nn.Identity()  # applied inside fc1's kernel now
            packed += kind != "plain"
    return packed


def linear_count(model: nn.Module) -> int:
    """nn.Linear and PackedLinear layers of `model`: what `pack_for_cpu_inference` could pack."""
    return sum(isinstance(m, (nn.Linear, PackedLinear)) for m in model.modules())
