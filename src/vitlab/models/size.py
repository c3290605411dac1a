"""What a model will cost before it is built, counted from its configuration alone: parameters, the
memory of its weights, of a training step and of inference; and `check_fits`, the one check that it
fits this machine's memory, which `create_model`, the commands and the page run before anything is
allocated. A size that cannot fit (`--img-size 100000`, `dim=10**9`, a config.json of absurd width) is
then one line with the estimate and the machine's memory, instead of an allocator's traceback after
minutes of work, or a machine brought to a halt.

The counts are exact for the parameters (a test builds every registered model on the meta device and
compares) and estimates for the activations (`activation_elements`, checked against what autograd
saves in tests/test_demo_info.py). `estimate_memory` is the one memory estimate: `check_fits` refuses
with it, `vitlab info` prints it and `vitlab bench --memory` sets it beside the measured peak. The
check refuses only what cannot fit even with nothing else running: an estimate above the machine's
memory (`vitlab.runtime.machine_memory`).

Per block of a ViT (D width, M MLP width, h heads, T tokens):
    parameters   norm1 2D + qkv 3D^2 (+3D bias) + proj D^2 + D + norm2 2D + fc1 DM + M + fc2 MD + D (+ LayerScale 2D)
    training     T (8D + 2M + 4 + h) floats saved per image (see activation_elements), and T 2M while the
                 backward pass runs
    inference    the image and T (D + 2M) floats alive per image at the peak (the residual stream, the MLP
                 hidden layer before and after GELU)
"""

from __future__ import annotations

import math

from vitlab.errors import VitlabError, check_range
from vitlab.models.cnn import ResNetConfig
from vitlab.models.vit import ViTConfig
from vitlab.options import check_precision
from vitlab.runtime import machine_memory

BYTES_FP32 = 4


# ----------------------------------------------------------------------------------------------------
# Parameters


def vit_parameters(cfg: ViTConfig) -> dict[str, int]:
    """Parameters per component of Eq. 1-4 (the keys of `vitlab.analysis.flops.parameter_breakdown`), and
    `total`; computed from the config, so it costs nothing whatever the size."""
    D, M, L, K, P, C = cfg.dim, cfg.hidden_dim, cfg.depth, cfg.num_classes, cfg.patch_size, cfg.in_chans
    gh, gw = cfg.grid_size
    if cfg.stem == "hybrid":
        stem, channels = _conv_stem(C, cfg.stem_width, P)
        patch = stem + channels * D + D  # the 1x1 projection, with bias
    else:
        patch = C * P * P * D + (D if cfg.patch_bias else 0)
    tokens = D * (int(cfg.class_token) + int(cfg.dist_token) + cfg.reg_tokens)
    positions = {
        "learned": (cfg.num_patches + cfg.num_pos_prefix_tokens) * D,
        "learned2d": (gh + gw) * (D // 2),
        "relative": L * cfg.heads * (2 * gh - 1) * (2 * gw - 1),
    }.get(cfg.pos_embed, 0)
    block = (
        2 * D
        + 3 * D * D
        + (3 * D if cfg.qkv_bias else 0)
        + D * D
        + D
        + 2 * D
        + D * M
        + M
        + M * D
        + D
        + (2 * D if cfg.layer_scale is not None else 0)
    )
    head = (cfg.pooled_dim * K + K if K else 0) + (D * K + K if K and cfg.use_dist_head else 0)
    out = {
        "patch_embed": patch,
        "cls_token + pos_embed": tokens + positions,
        "blocks": L * block,
        "norm": 2 * D + (2 * D if cfg.pre_norm else 0),
        "head": head,
    }
    out["total"] = sum(out.values())
    return out


def _basic_block(cin: int, cout: int, stride: int) -> int:
    """torchvision's BasicBlock: two 3x3 convolutions without bias, each with a BatchNorm (2 parameters a
    channel), and a 1x1 convolution + BatchNorm on the shortcut when the shape changes."""
    down = cin * cout + 2 * cout if stride != 1 or cin != cout else 0
    return 9 * cin * cout + 2 * cout + 9 * cout * cout + 2 * cout + down


def _conv_stem(cin: int, width: int, downsample: int) -> tuple[int, int]:
    """(parameters, output channels) of vitlab.models.cnn.ConvStem."""
    n, ch = 9 * cin * width + 2 * width, width
    for i in range(int(math.log2(downsample))):
        out = width * min(2 ** (i + 1), 4)
        n, ch = n + _basic_block(ch, out, 2), out
    return n, ch


def resnet_parameters(cfg: ResNetConfig) -> int:
    """Parameters of vitlab.models.cnn.ResNetMini: a 3x3 stem, three stages of BasicBlocks (widths w, 2w,
    4w), a linear head."""
    w, b = cfg.width, cfg.blocks
    n = 9 * cfg.in_chans * w + 2 * w
    for cin, cout, stride in ((w, w, 1), (w, 2 * w, 2), (2 * w, 4 * w, 2)):
        n += _basic_block(cin, cout, stride) + (b - 1) * _basic_block(cout, cout, 1)
    return n + 4 * w * cfg.num_classes + cfg.num_classes


def parameters(cfg: ViTConfig | ResNetConfig) -> int:
    return vit_parameters(cfg)["total"] if isinstance(cfg, ViTConfig) else resnet_parameters(cfg)


# ----------------------------------------------------------------------------------------------------
# Memory


def activation_elements(cfg: ViTConfig) -> dict[str, int]:
    """Elements autograd saves per image in one training forward pass (fused attention, no dropout).

    Per block, per token: the LN1 input and output (D + D), the qkv output (3D: q, k, v are views of
    it), the SDPA output (D; the output projection reads it as a view, heads concatenated), the LN2
    input and output (D + D), the GELU input and output (M + M): 8D + 2M; plus each LayerNorm's mean
    and 1/std (2 + 2) and SDPA's log-sum-exp (h). Before the blocks, the image (the patch projection's
    input); after them, the final LN's input, output and statistics, and the loss's log-softmax.
    A test checks this against what autograd actually saves (`vitlab.analysis.flops.measure_saved_activations`).
    """
    T, D, M, L = cfg.num_patches + cfg.num_prefix_tokens, cfg.dim, cfg.hidden_dim, cfg.depth
    H, W = cfg.img_size
    return {
        "input image": cfg.in_chans * H * W,
        "blocks": L * T * (8 * D + 2 * M + 4 + cfg.heads),
        "final norm + head": T * (2 * D + 2) + cfg.num_classes,
    }


def _resnet_activations(cfg: ResNetConfig, *, training: bool) -> int:
    """Elements per image: in training every layer's output is kept (a convolution's and its BatchNorm's,
    ~5 maps of each BasicBlock); in inference about three maps of the largest stage are alive at once."""
    H, W = cfg.img_size
    w, b = cfg.width, cfg.blocks
    maps = [(w, H * W), (2 * w, math.ceil(H / 2) * math.ceil(W / 2)), (4 * w, math.ceil(H / 4) * math.ceil(W / 4))]
    if not training:
        return cfg.in_chans * H * W + 3 * max(c * n for c, n in maps)
    return cfg.in_chans * H * W + 2 * w * H * W + sum(5 * b * c * n + 2 * c * n for c, n in maps)


def estimate_memory(
    cfg: ViTConfig | ResNetConfig,
    batch_size: int,
    *,
    train: bool = True,
    precision: str = "fp32",
    grad_checkpointing: bool = False,
    attention: bool = False,
) -> dict[str, int]:
    """Bytes a run needs, by part, counted from the config before anything is built: weights, and for
    training gradients, AdamW's two moments, the saved activations and the backward pass's working
    gradient; for inference the activations alive at the peak; and their `total`. `vitlab bench --memory`
    prints it next to the measured peak, and `check_fits` refuses what it says cannot fit.

    Training keeps, per block, the tensors autograd saves (`activation_elements`: ~T (8D + 2M) per image),
    and while the backward pass runs it holds the gradient of the widest activation, the MLP's hidden layer
    before and after GELU (T 2M). With gradient checkpointing only each block's input (T D) is kept, plus
    one block's saved tensors while it is recomputed. Under bf16 autocast the saved matrix-product inputs
    are bf16 (about half of them); the weights and AdamW state stay fp32.
    Inference keeps no activations: the peak is the input images (fp32) and the largest few live tensors
    of one block (the residual stream, the MLP's hidden layer before and after GELU: T (D + 2M) per image).
    `attention`: the explicit path's softmax(QK^T/sqrt(d)) kept, an (h, T, T) matrix per layer (training:
    saved for backward; inference: every layer's map returned, as `return_attention=True` does, and the
    one being computed), in fp32.
    Not counted: the allocator's slack, the framework itself (~0.3-0.5 GB of libraries for torch).
    """
    check_range("batch_size", batch_size, low=1, integer=True)
    check_precision(precision)
    params = parameters(cfg)
    out = {"weights": params * BYTES_FP32}
    if train:
        out["gradients"] = params * BYTES_FP32
        out["optimizer"] = 2 * params * BYTES_FP32  # AdamW's exp_avg, exp_avg_sq
    if isinstance(cfg, ResNetConfig):
        out["activations"] = batch_size * _resnet_activations(cfg, training=train) * BYTES_FP32
        out["total"] = sum(out.values())
        return out
    act_bytes = 3.0 if precision == "bf16" else 4.0  # bf16: ~half the saved tensors are 2-byte casts
    T, D, M, L, h = cfg.num_patches + cfg.num_prefix_tokens, cfg.dim, cfg.hidden_dim, cfg.depth, cfg.heads
    if train:
        per_image = activation_elements(cfg)
        if grad_checkpointing:
            block = per_image["blocks"] // L
            kept = L * T * D + block + per_image["input image"] + per_image["final norm + head"]
        else:
            kept = sum(per_image.values())
        out["activations"] = int(batch_size * kept * act_bytes)
        out["backward"] = batch_size * T * 2 * M * BYTES_FP32  # the gradient of the MLP's hidden layer
    else:
        H, W = cfg.img_size
        per_image = cfg.in_chans * H * W * BYTES_FP32 + T * (D + 2 * M) * (2 if precision == "bf16" else BYTES_FP32)
        out["activations"] = batch_size * per_image  # the input images, and one block's widest tensors
    if attention:
        layers = L if train else L + 1  # inference: the maps kept, and the one being computed
        out["attention maps"] = batch_size * layers * h * T * T * BYTES_FP32
    out["total"] = sum(out.values())
    return out


# ----------------------------------------------------------------------------------------------------
# The check


def format_bytes(n: float) -> str:
    for scale, prefix in ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {prefix}"
    return f"{n:.0f} B"


def describe_size(cfg: ViTConfig | ResNetConfig) -> str:
    """The sizes that decide the cost, in a few words (for messages)."""
    if isinstance(cfg, ResNetConfig):
        return f"width {cfg.width}, {cfg.blocks} block(s) per stage, {cfg.img_size[0]}x{cfg.img_size[1]} images"
    return (
        f"dim {cfg.dim}, depth {cfg.depth}, MLP {cfg.hidden_dim}, {cfg.num_patches:,} patches of "
        f"{cfg.img_size[0]}x{cfg.img_size[1]} images"
    )


def check_memory(needed: int, what: str, *, arg: str | None = None, fix: str = "") -> None:
    """Refuse, in one line, work whose memory estimate exceeds this machine's memory."""
    have = machine_memory()
    if needed > have:
        raise VitlabError(
            f"{what} would need about {format_bytes(needed)} of memory; this machine has {format_bytes(have)}{fix}",
            arg=arg,
        )


def check_fits(
    cfg: ViTConfig | ResNetConfig,
    *,
    what: str = "the model",
    batch_size: int | None = None,
    training: bool = False,
    attention: bool = False,
    arg: str | None = None,
) -> None:
    """Refuse a model (and, with `batch_size`, a training step or a forward pass) that cannot fit this
    machine's memory, before anything is built. The message gives the estimate, what it is made of, and the
    machine's memory."""
    params = parameters(cfg)
    shape = f"{what} ({describe_size(cfg)}: {params:,} parameters)"
    check_memory(
        params * BYTES_FP32,
        f"{shape}: its weights alone",
        arg=arg,
        fix="; choose smaller sizes (vitlab info shows what a model costs)",
    )
    if batch_size is None:
        return
    estimate = estimate_memory(cfg, batch_size, train=training, attention=attention)["total"]
    if training:
        doing = f"training {shape} at batch {batch_size:,}"
    else:
        doing = f"running {shape} on {batch_size:,} image(s){' with its attention maps' if attention else ''}"
    check_memory(estimate, doing, arg=arg, fix="; lower the batch size or the image size")


__all__ = [
    "BYTES_FP32",
    "vit_parameters",
    "resnet_parameters",
    "parameters",
    "activation_elements",
    "estimate_memory",
    "format_bytes",
    "describe_size",
    "check_memory",
    "check_fits",
]
