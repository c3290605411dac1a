"""What a model will cost before it is built, counted from its configuration alone: parameters, the
memory of its weights, of a training step and of inference; and `check_fits`, the one check that it
fits this machine's memory, which `create_model`, the commands and the page run before anything is
allocated. A size that cannot fit (`--img-size 100000`, `dim=10**9`, a config.json of absurd width) is
then one line with the estimate and the machine's memory, instead of an allocator's traceback after
minutes of work, or a machine brought to a halt.

The counts are exact for the parameters (a test builds every registered model on the meta device and
compares) and estimates for the activations (`activation_elements`, checked against what autograd
saves in tests/test_demo_info.py). The check refuses only what cannot fit even with nothing else
running: an estimate above the machine's memory (`vitlab.runtime.machine_memory`).

Per block of a ViT (D width, M MLP width, h heads, T tokens):
    parameters   norm1 2D + qkv 3D^2 (+3D bias) + proj D^2 + D + norm2 2D + fc1 DM + M + fc2 MD + D (+ LayerScale 2D)
    training     T (8D + 2M + 4 + h) floats saved per image (see activation_elements)
    inference    T (4D + M) floats alive per image at the peak (the block's input, LN output, qkv, MLP hidden)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vitlab.errors import VitlabError
from vitlab.models.cnn import ResNetConfig
from vitlab.models.vit import ViTConfig
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


@dataclass
class MemoryEstimate:
    """Bytes for training at one batch size in fp32 with AdamW.

    Activations are the tensors autograd keeps for the backward pass (counted per block below);
    weights, gradients and AdamW's two moment buffers are 4 bytes each per parameter (16 in all).
    """

    batch_size: int
    params: int
    activations: int  # with fused attention (SDPA keeps no T x T matrix)
    attention_matrices: int  # extra, when the explicit path keeps softmax(QK^T/sqrt(d)) per layer
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def weights(self) -> int:
        return self.params * BYTES_FP32

    @property
    def optimizer_state(self) -> int:
        return self.params * BYTES_FP32 * 3  # gradients + AdamW exp_avg + exp_avg_sq

    @property
    def total(self) -> int:
        return self.weights + self.optimizer_state + self.activations


def activation_elements(cfg: ViTConfig) -> dict[str, int]:
    """Elements autograd saves per image in one training forward pass (fused attention, no dropout).

    Per block, per token: the LN1 input and output (D + D), the qkv output (3D: q, k, v are views of
    it), the SDPA output (D; the output projection reads it as a view, heads concatenated), the LN2
    input and output (D + D), the GELU input and output (M + M): 8D + 2M; plus each LayerNorm's mean
    and 1/std (2 + 2) and SDPA's log-sum-exp (h). Before the blocks, the image (the patch projection's
    input); after them, the final LN's input, output and statistics, and the loss's log-softmax.
    The test checks this against what autograd actually saves (`measure_saved_activations`).
    """
    T, D, M, L = cfg.num_patches + cfg.num_prefix_tokens, cfg.dim, cfg.hidden_dim, cfg.depth
    H, W = cfg.img_size
    return {
        "input image": cfg.in_chans * H * W,
        "blocks": L * T * (8 * D + 2 * M + 4 + cfg.heads),
        "final norm + head": T * (2 * D + 2) + cfg.num_classes,
    }


def training_memory(cfg: ViTConfig, batch_size: int, params: int | None = None) -> MemoryEstimate:
    """An estimate of training memory at `batch_size` (fp32, AdamW); see `activation_elements`."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise VitlabError(f"batch_size must be at least 1; found {batch_size}", arg="batch_size")
    params = vit_parameters(cfg)["total"] if params is None else params
    T = cfg.num_patches + cfg.num_prefix_tokens
    rows = {k: v * batch_size * BYTES_FP32 for k, v in activation_elements(cfg).items()}
    attn = cfg.depth * cfg.heads * T * T * batch_size * BYTES_FP32  # one (h, T, T) matrix per layer
    return MemoryEstimate(batch_size, params, sum(rows.values()), attn, rows)


def _resnet_activations(cfg: ResNetConfig, *, training: bool) -> int:
    """Elements per image: in training every layer's output is kept (a convolution's and its BatchNorm's,
    ~5 maps of each BasicBlock); in inference about three maps of the largest stage are alive at once."""
    H, W = cfg.img_size
    w, b = cfg.width, cfg.blocks
    maps = [(w, H * W), (2 * w, math.ceil(H / 2) * math.ceil(W / 2)), (4 * w, math.ceil(H / 4) * math.ceil(W / 4))]
    if not training:
        return cfg.in_chans * H * W + 3 * max(c * n for c, n in maps)
    return cfg.in_chans * H * W + 2 * w * H * W + sum(5 * b * c * n + 2 * c * n for c, n in maps)


def inference_bytes(cfg: ViTConfig | ResNetConfig, batch_size: int = 1, *, attention: bool = False) -> int:
    """Weights and the peak of one forward pass without gradients at `batch_size` (fp32); with `attention`,
    every layer's (h, T, T) attention weights kept, as `return_attention=True` does."""
    weights = parameters(cfg) * BYTES_FP32
    if isinstance(cfg, ResNetConfig):
        return weights + batch_size * _resnet_activations(cfg, training=False) * BYTES_FP32
    T = cfg.num_patches + cfg.num_prefix_tokens
    H, W = cfg.img_size
    per_image = cfg.in_chans * H * W + T * (4 * cfg.dim + cfg.hidden_dim)
    if attention:
        per_image += (cfg.depth + 1) * cfg.heads * T * T  # the kept maps, and the one being computed
    return weights + batch_size * per_image * BYTES_FP32


def training_bytes(cfg: ViTConfig | ResNetConfig, batch_size: int) -> int:
    """Weights, gradients, AdamW's two moments and the saved activations of one training step at `batch_size`."""
    if isinstance(cfg, ViTConfig):
        return training_memory(cfg, batch_size).total
    return 4 * resnet_parameters(cfg) * BYTES_FP32 + batch_size * _resnet_activations(cfg, training=True) * BYTES_FP32


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
    if training:
        check_memory(
            training_bytes(cfg, batch_size),
            f"training {shape} at batch {batch_size:,}",
            arg=arg,
            fix="; lower the batch size or the image size",
        )
    else:
        check_memory(
            inference_bytes(cfg, batch_size, attention=attention),
            f"running {shape} on {batch_size:,} image(s){' with its attention maps' if attention else ''}",
            arg=arg,
            fix="; lower the batch size or the image size",
        )


__all__ = [
    "BYTES_FP32",
    "vit_parameters",
    "resnet_parameters",
    "parameters",
    "MemoryEstimate",
    "activation_elements",
    "training_memory",
    "inference_bytes",
    "training_bytes",
    "format_bytes",
    "describe_size",
    "check_memory",
    "check_fits",
]
