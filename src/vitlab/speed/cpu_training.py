"""Training on CPU in fp32 with, for each matrix product, the library that is faster on this machine.

A ViT training step is ~85% matrix products (torch.profiler, one core), and in fp32 an nn.Linear
sends all three of its products to MKL: y = x W^T + b forward, and backward dx = dy W and dW = dy^T x.
oneDNN's kernel, with the weight reordered into its blocked layout on each call (the weights change
every step, so it cannot be done once as in `vitlab.speed.cpu_inference`), is faster on some CPUs and
shapes and slower on others: on an AMD EPYC core it beat MKL by 10-18% for y and dx at ViT-B/16's
shapes from batch 8 up and lost at batch 1; on an Intel Xeon with AMX it ran y at 0.71-1.30x and dx
at 0.30-0.97x MKL's speed (`python benchmarks/bench_train_linears.py --products`). No size threshold
carries over, so `TrainingLinear` asks this machine: the first time a product shape (rows x in x out)
trains, y and dx are timed both ways (`vitlab.speed.calibration`, remembered per CPU and torch
version), and each takes the faster library from then on. dW stays with MKL: oneDNN needs both
operands transposed and reordered for it, and was the slower on both CPUs measured (0.51-1.09x).

A `TrainingLinear` is an nn.Linear whenever no product takes oneDNN: under autocast (bf16 casts the
weights anyway), in eval mode, without gradients, off the CPU, while torch.compile or torch.export
traces the model (they choose their own kernels), and where MKL measured as fast. The results agree
with MKL's to float rounding (tested).

`use_onednn_linears(model)` swaps every nn.Linear of a model for a TrainingLinear that holds the
same Parameter objects: the state_dict, an optimizer built before or after, and checkpoints are
unchanged. vitlab's trainers (`fit`, `vitlab train`, `vitlab finetune`) call it on CPU, and keep the
choices only where the whole training step is measured faster with them
(`vitlab.speed.fastpath.check_whole_step`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.speed.calibration import Calibration, calibration, threads_tag


def supported() -> bool:
    """Whether this torch build has oneDNN for the CPU."""
    return torch.backends.mkldnn.is_available()


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b by oneDNN, W (out, in) reordered for x's rows."""
    rows = x.numel() // x.shape[-1]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def product_choice(rows: int, in_features: int, out_features: int, cal: Calibration) -> tuple[bool, bool]:
    """(y by oneDNN, dx by oneDNN) for an fp32 training product of this shape, measured on first use."""
    shape = f"fp32/{threads_tag()}/{rows}x{in_features}x{out_features}"
    y, dx = cal.get(f"train-linear-y/{shape}"), cal.get(f"train-linear-dx/{shape}")
    if y is None or dx is None:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(rows, in_features, generator=g), torch.randn(out_features, in_features, generator=g)
        b, dy = torch.randn(out_features, generator=g), torch.randn(rows, out_features, generator=g)
        y = {"choice": cal.choose(f"train-linear-y/{shape}", {
            "mkl": lambda: F.linear(x, w, b), "onednn": lambda: _onednn_linear(x, w, b)})}
        dx = {"choice": cal.choose(f"train-linear-dx/{shape}", {
            "mkl": lambda: dy.mm(w), "onednn": lambda: _onednn_linear(dy, w.t().contiguous(), None)})}
    return y["choice"] == "onednn", dx["choice"] == "onednn"


class _LinearFunction(torch.autograd.Function):
    """y = x W^T + b with y and dx = dy W each by the library chosen for them; dW and db by MKL / aten."""

    @staticmethod
    def forward(ctx, x, weight, bias, y_onednn: bool, dx_onednn: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # what nn.Linear's backward keeps too
        ctx.has_bias, ctx.dx_onednn = bias is not None, dx_onednn
        return _onednn_linear(x, weight, bias) if y_onednn else F.linear(x, weight, bias)  # (..., out)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            # dy W = dy (W^T)^T: a Linear of weight W^T
            dx = _onednn_linear(dy, weight.t().contiguous(), None) if ctx.dx_onednn else dy.matmul(weight)
        dy2 = dy.reshape(-1, dy.shape[-1])  # (rows, out)
        if ctx.needs_input_grad[1]:
            dw = dy2.t().mm(x.reshape(-1, x.shape[-1]))  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None, None


def eligible(x: torch.Tensor, linear: nn.Linear) -> bool:
    """Whether this call could take oneDNN at all: an fp32 training product on the CPU, outside
    autocast and outside torch.compile / torch.export tracing (they choose their own kernels). The test
    that depends on the input's shape comes last, so a trace puts no guard on a dynamic batch."""
    return (
        linear.training
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and linear.weight.dtype == torch.float32
    )


class TrainingLinear(nn.Linear):
    """An nn.Linear whose fp32 training products on CPU each take the library measured faster here."""

    calibration: Calibration | None = None  # set by use_onednn_linears (None: found on each call)
    measured: bool = True  # False: an nn.Linear (`take_measured_products`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.measured and eligible(x, self):
            rows = x.numel() // x.shape[-1]
            y_onednn, dx_onednn = product_choice(rows, self.in_features, self.out_features,
                                                 self.calibration or calibration())
            if y_onednn or dx_onednn:
                return _LinearFunction.apply(x, self.weight, self.bias, y_onednn, dx_onednn)
        return F.linear(x, self.weight, self.bias)


def use_onednn_linears(model: nn.Module, cal: Calibration | None = None) -> int:
    """Swap each nn.Linear of `model` (in place) for a TrainingLinear with the same parameters, whose
    choices come from `cal` (default: this machine's calibration file). Returns how many were
    swapped; 0 for a model that is not on the CPU, or without oneDNN."""
    if not supported() or any(p.device.type != "cpu" for p in model.parameters()):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                new = TrainingLinear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                new.weight, new.bias = child.weight, child.bias  # the same Parameter objects
                new.calibration = cal or calibration()  # found once: not on every call
                new.train(child.training)
                setattr(parent, name, new)
                swapped += 1
    return swapped


def take_measured_products(model: nn.Module, on: bool = True) -> None:
    """Each TrainingLinear of `model` takes the library measured faster (True) or is an nn.Linear (False)."""
    for m in model.modules():
        if isinstance(m, TrainingLinear):
            m.measured = on
