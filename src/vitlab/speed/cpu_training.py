"""Training on CPU in fp32 with oneDNN's matrix products where they beat MKL's.

A ViT-B/16 training step is ~85% matrix products (torch.profiler, one core), and in fp32 an nn.Linear
sends all three of its products to MKL: y = x W^T + b forward, and backward dx = dy W and dW = dy^T x.
On the development VM (AMD EPYC, one core) oneDNN's kernel, with the weight reordered into its blocked
layout on each call (the weights change every step, so it cannot be done once as in
`vitlab.speed.cpu_inference`), is faster than MKL for the first two products on big enough shapes and
slower for dW (`python benchmarks/bench_train_linears.py --products`; MKL time over oneDNN time, the
range over ViT-B/16's four Linear shapes):

    rows (batch x tokens)     forward y     backward dx     backward dW
    197 (ViT-B/16, batch 1)   0.78-0.96x    0.45-0.72x      0.82-1.09x
    1576 (batch 8)            1.10-1.18x    1.01-1.11x      0.89-1.03x
    6304 (batch 32)           1.11-1.18x    1.11-1.16x      0.84-0.94x

So `TrainingLinear` runs y and dx through oneDNN and dW through MKL when a product has at least
MIN_ROWS rows and MIN_FEATURES input and output features, and is an nn.Linear otherwise: under
autocast, in eval mode, without gradients, off the CPU, under torch.compile / torch.export, and at
the small shapes of the mini experiment (D = 32), where oneDNN's per-call reorder costs more than it
saves. The results agree with MKL's to float rounding (tested); the training step's measured gain is
in the README (`vitlab bench --train --against timm`).

`use_onednn_linears(model)` swaps every nn.Linear of a model for a TrainingLinear that holds the
same Parameter objects: the state_dict, an optimizer built before or after, and checkpoints are
unchanged. vitlab's trainers (`fit`, `vitlab train`, `vitlab finetune`) call it on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 1024  # at 197 rows oneDNN's per-call weight reorder costs more than it saves (table above)
MIN_FEATURES = 256  # narrower products (vit_mini_x: 32 -> 96) gain nothing or lose: the reorder dominates


def supported() -> bool:
    """Whether this torch build has oneDNN for the CPU."""
    return torch.backends.mkldnn.is_available()


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b by oneDNN, W (out, in) reordered for x's rows."""
    rows = x.numel() // x.shape[-1]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _LinearFunction(torch.autograd.Function):
    """y = x W^T + b: y and dx = dy W by oneDNN, dW = dy^T x and db by MKL / aten (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # what nn.Linear's backward keeps too
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)  # (..., out)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _onednn_linear(dy, weight.t().contiguous(), None)  # dy W = dy (W^T)^T: a Linear of weight W^T
        dy2 = dy.reshape(-1, dy.shape[-1])  # (rows, out)
        if ctx.needs_input_grad[1]:
            dw = dy2.t().mm(x.reshape(-1, x.shape[-1]))  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db


def pays_off(x: torch.Tensor, linear: nn.Linear) -> bool:
    """Whether this call takes the oneDNN path (see the module docstring for the measurements).
    Never while torch.compile or torch.export traces the model: they choose their own kernels, and the
    row count, the only test that depends on the input's shape, comes last (no guard on a dynamic batch)."""
    return (
        linear.training
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and linear.weight.dtype == torch.float32
        and min(linear.in_features, linear.out_features) >= MIN_FEATURES
        and x.numel() // x.shape[-1] >= MIN_ROWS
    )


class TrainingLinear(nn.Linear):
    """An nn.Linear whose fp32 training products on CPU take the faster library per product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if pays_off(x, self):
            return _LinearFunction.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_onednn_linears(model: nn.Module) -> int:
    """Swap each nn.Linear of `model` (in place) for a TrainingLinear with the same parameters.
    Returns how many were swapped; 0 for a model that is not on the CPU, or without oneDNN."""
    if not supported() or any(p.device.type != "cpu" for p in model.parameters()):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                new = TrainingLinear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                new.weight, new.bias = child.weight, child.bias  # the same Parameter objects
                new.train(child.training)
                setattr(parent, name, new)
                swapped += 1
    return swapped
