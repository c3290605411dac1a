"""Which attention kernel a ViT runs on this CPU: torch's fused one or the explicit products.

`F.scaled_dot_product_attention` on a CPU is a flash-attention loop; the explicit softmax(q k^T / sqrt(d)) v
is two batched matrix products and a softmax. Which is faster depends on the CPU and the precision: in
bf16 the explicit products ran 1.4-2.4x the fused kernel on an AMD EPYC core, while on an Intel Xeon
with AMX the fused kernel was ahead. `choose_attention` times one block's attention both ways at the
shape it will run (batch, tokens, heads; forward, and backward for training), once per CPU and torch
version (`vitlab.speed.calibration`), and sets the model to the faster (`set_fused_attention`). The
fused kernel is the default, kept unless the explicit products measure faster here; off the CPU it is
never second-guessed.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitlab.models.vit import VisionTransformer
from vitlab.runtime import autocast
from vitlab.speed.calibration import Calibration, calibration, threads_tag


def choose_attention(model: nn.Module, *, precision: str, batch_size: int, train: bool = False,
                     cal: Calibration | None = None) -> str | None:
    """Set `model`'s attention to the faster path here; returns "fused" or "explicit" (None: not a ViT
    on the CPU, left as it is)."""
    if not isinstance(model, VisionTransformer) or next(model.parameters()).device.type != "cpu":
        return None
    cal = cal or calibration()
    c = model.cfg
    tokens = c.num_patches + c.num_prefix_tokens
    mode = "train" if train else "infer"
    key = f"attention/{mode}/{precision}/{threads_tag()}/b{batch_size}xh{c.heads}xn{tokens}xd{c.dim // c.heads}"
    entry = cal.get(key)
    if entry is None:
        attn = copy.deepcopy(model.blocks[0].attn).train(train)
        attn.attn_drop.p = attn.proj_drop.p = 0.0  # time the kernels, not dropout's masks
        x = torch.randn(batch_size, tokens, c.dim, generator=torch.Generator().manual_seed(0), requires_grad=train)
        device = torch.device("cpu")

        def run(fused: bool):
            def fn() -> None:
                attn.fused = fused
                with torch.enable_grad() if train else torch.inference_mode():
                    with autocast(device, precision):
                        out, _ = attn(x)
                    if train:
                        out.float().sum().backward()

            return fn

        entry = {"choice": cal.choose(key, {"fused": run(True), "explicit": run(False)})}
    model.set_fused_attention(entry["choice"] == "fused")
    return entry["choice"]


__all__ = ["choose_attention"]
