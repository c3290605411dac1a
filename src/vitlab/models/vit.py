"""The Vision Transformer of Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", in one file.

Read it next to Section 3.1 of the paper. The four equations:

    Eq. 1   z_0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos        PatchEmbed, cls_token, pos_embed
    Eq. 2   z'_l = MSA(LN(z_{l-1})) + z_{l-1}                        Block (first half), Attention
    Eq. 3   z_l  = MLP(LN(z'_l)) + z'_l                              Block (second half), Mlp
    Eq. 4   y    = LN(z_L^0)                                         VisionTransformer.forward_head

Shapes: B batch, C channels, H x W image, P patch size, N = HW/P^2 patches, D width, h heads,
d = D/h head width. Module names follow timm (`patch_embed.proj`, `blocks.0.attn.qkv`, ...), so a timm
state dict loads with no renaming.

The design switches the paper discusses are fields of `ViTConfig`: patch size, position embedding
(`learned` 1-D as in the paper, `learned2d`, `sincos2d`, `relative`, `none`; Appendix D.4, Table 8),
pooling (`cls` or `mean`; Appendix D.3), and the hybrid stem (`stem="hybrid"`, Section 3.1).

Deliberate departures from the paper, each for a reason:
- The pre-training head (an MLP with one tanh hidden layer) is not built: vitlab trains and fine-tunes
  with the single linear, zero-initialised head the paper uses for fine-tuning (Section 3.2).
- `pos_embed="learned2d"` concatenates a row and a column table of D/2 each, as in Appendix D.4;
  the class token then gets no position (it is the same token at every position anyway).
- `pool="mean"` applies the final LayerNorm after pooling (`fc_norm`), as timm and big_vision do for
  global average pooling, so their GAP checkpoints load and agree; `fc_norm=False` keeps it before the
  pool, as the original JAX release's classifier="gap" (with `class_token=False`).
- The attention has two paths: `F.scaled_dot_product_attention` (fast, fused) and the explicit
  softmax(QK^T / sqrt(d)) V of Eq. 5-7 in Appendix A, used when attention weights are asked for
  (`return_attention=`, per call), or for a model told to (`set_fused_attention(False)`, per model:
  some CPUs run the explicit products faster in bf16, and `vitlab.speed` measures which). Nothing
  global decides. Tests check they agree.

The family that followed the paper changed a few parts; each is a `ViTConfig` field whose default is
the paper's, so that DeiT, DINO/DINOv2 and CLIP checkpoints load exactly (module names as in timm):
- `dist_token` (DeiT, Touvron et al. 2021): a distillation token after the class token, read by a
  second head (`head_dist`); at inference the two heads' logits are averaged, as DeiT does.
- `reg_tokens` ("Vision Transformers Need Registers", Darcet et al. 2023): learned tokens after the
  class token that no head reads; they give the model somewhere other than patches to keep global
  information (`reg_token`).
- `layer_scale` (CaiT, Touvron et al. 2021; DINOv2, DeiT III): a learned per-channel gain on each
  residual branch, `z' = z + diag(gamma) MSA(LN(z))` (`blocks.i.ls1.gamma`, `ls2.gamma`).
- `pre_norm` and `patch_bias=False` (CLIP, Radford et al. 2021): a LayerNorm on z_0 before the first
  block (`norm_pre`), and a patch embedding without bias. `act="quick_gelu"`: OpenAI CLIP's
  x * sigmoid(1.702 x) in the MLP.
- `no_embed_class` (DeiT III, DINOv2 with registers, big_vision): the 1-D position table covers the
  patches only; prefix tokens get no position.
- `qkv_bias=False`: no bias on the q, k, v projections. `pool="cls+mean"`: DINOv2's linear probe, the
  class token concatenated with the mean of the patch tokens (a head of 2D inputs).
Prefix tokens come first, in the order [class, distillation, registers], then the N patches;
`cfg.num_prefix_tokens` counts them all.

`VisionTransformer` has timm's interface (`forward_features`, `forward_head`, `forward_intermediates`,
`feature_info`, `prune_intermediate_layers`, `set_input_size`, `reset_classifier`, `get_classifier`,
`num_features`, `group_matcher`, ...), so code written for timm's ViT runs on it. `dynamic_img_size=True`
takes any image size whose sides are multiples of P (any size at all with `dynamic_img_pad=True`, which
zero-pads the right and bottom), the position table resampled per call (Section 3.2's 2-D interpolation),
as timm does. It is traced with `torch.fx.symbolic_trace`, `torch.jit.trace` or
`torch.export`: the input checks, the table's resampling and the explicit attention are `torch.fx.wrap`ped
functions, so a traced graph still checks each input and runs them on real tensors. `torch.jit.script` is
refused in one line (the forward takes Python options; docs/family.md says why it stays so).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.ops import StochasticDepth

from vitlab.errors import VitlabError, check_range
from vitlab.models.cnn import ConvStem, check_images  # the hybrid stem is the CNN baseline's ResNet stages
from vitlab.options import INITS  # VisionTransformer.init_weights

POS_EMBEDS = ("learned", "learned2d", "sincos2d", "relative", "none")
POOLS = ("cls", "mean", "cls+mean")
ACTS = ("gelu", "quick_gelu")
PATCH_EMBEDS = ("conv", "linear")
STEMS = ("patch", "hybrid")


# ----------------------------------------------------------------------------------------------------
# Configuration: the paper's defaults (ViT-B/16 at 224, Table 1)


@dataclass
class ViTConfig:
    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 768  # D, the "hidden size" of Table 1
    depth: int = 12  # L, number of blocks
    heads: int = 12  # h
    mlp_dim: int | None = None  # MLP hidden size; None means mlp_ratio * dim (3072 for ViT-B)
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    pos_embed: str = "learned"  # one of POS_EMBEDS; the paper's default is a learned 1-D table
    pool: str = "cls"  # "cls": read z_L^0 (Eq. 4); "mean": average the patch tokens
    class_token: bool = True  # prepend x_class; must be True for pool="cls"
    fc_norm: bool | None = None  # LayerNorm after pooling instead of before; None = (pool == "mean")
    patch_embed: str = "conv"  # "conv": Conv2d(kernel = stride = P); "linear": flatten + Linear
    stem: str = "patch"  # "hybrid": a ResNet-style conv stem makes the feature map (Section 3.1)
    stem_width: int = 64  # hybrid stem only: channels of its first stage
    dropout: float = 0.0  # after the position embedding and inside the MLP/projection
    attn_dropout: float = 0.0  # on the attention weights
    drop_path: float = 0.0  # stochastic depth, rising linearly to this rate in the last block
    norm_eps: float = 1e-6  # LayerNorm epsilon (JAX, timm and torchvision use 1e-6; CLIP 1e-5)
    # The family (module docstring): each default is the paper's model.
    dist_token: bool = False  # DeiT: a distillation token after the class token
    dist_head: bool | None = None  # DeiT: a second head on it, averaged with the first; None = dist_token
    reg_tokens: int = 0  # register tokens (Darcet et al. 2023), after the class (and distillation) token
    layer_scale: float | None = None  # LayerScale's initial gain (DINOv2 1e-5, DeiT III 1e-6); None = none
    pre_norm: bool = False  # CLIP: a LayerNorm on z_0 before the first block
    patch_bias: bool = True  # False for CLIP's patch embedding
    no_embed_class: bool = False  # the 1-D position table covers the patches only (DeiT III, DINOv2 + registers)
    act: str = "gelu"  # the MLP's non-linearity: "gelu" (Section 3.1) or "quick_gelu" (OpenAI CLIP)
    dynamic_img_size: bool = False  # timm's: any H x W (multiples of P), the position table resampled per call
    dynamic_img_pad: bool = False  # timm's, with dynamic_img_size: other sides zero-padded to multiples of P

    def __post_init__(self) -> None:
        # Every field is checked for its type and range before any arithmetic, in the field's own name, so a
        # bad argument (or a bad field of a config.json) is one message naming it, never a deep TypeError.
        self.img_size = _pair(self.img_size, "img_size")
        for name in ("patch_size", "in_chans", "dim", "depth", "heads", "stem_width"):
            check_range(name, getattr(self, name), low=1, integer=True)
        check_range("num_classes", self.num_classes, low=0, integer=True)
        check_range("reg_tokens", self.reg_tokens, low=0, integer=True)
        check_range("mlp_dim", self.mlp_dim, low=1, integer=True, optional=True)
        check_range("mlp_ratio", self.mlp_ratio, low=0, low_open=True)
        check_range("norm_eps", self.norm_eps, low=0, low_open=True, hint=" (LayerNorm divides by sqrt(var + eps))")
        check_range(
            "layer_scale",
            self.layer_scale,
            low=0,
            low_open=True,
            optional=True,
            hint=" (None: no LayerScale; else its initial gain)",
        )
        for name in ("dropout", "attn_dropout", "drop_path"):
            check_range(name, getattr(self, name), low=0, high=1, high_open=True)
        for name in (
            "qkv_bias",
            "class_token",
            "dist_token",
            "pre_norm",
            "patch_bias",
            "no_embed_class",
            "dynamic_img_size",
            "dynamic_img_pad",
        ):
            _check_bool(name, getattr(self, name))
        for name in ("fc_norm", "dist_head"):
            _check_bool(name, getattr(self, name), optional=True)
        _check_choice("pos_embed", self.pos_embed, POS_EMBEDS)
        _check_choice("pool", self.pool, POOLS)
        _check_choice("patch_embed", self.patch_embed, PATCH_EMBEDS)
        _check_choice("stem", self.stem, STEMS)
        _check_choice("act", self.act, ACTS)
        H, W = self.img_size
        P = self.patch_size
        if H % P or W % P:
            raise VitlabError(
                f"img_size {H}x{W} is not divisible by patch_size {P}: "
                f"expected a multiple of {P} (for example {max(P, H // P * P)})",
                arg="img_size",
            )
        if self.dim % self.heads:
            raise VitlabError(
                f"dim {self.dim} is not divisible by heads {self.heads}: "
                f"each head gets dim/heads channels (try heads in {_divisors(self.dim)})",
                arg="dim",
            )
        if self.pos_embed == "sincos2d" and self.dim % 4:
            raise VitlabError(f"pos_embed 'sincos2d' needs dim divisible by 4, found dim {self.dim}")
        if self.pos_embed == "learned2d" and self.dim % 2:
            raise VitlabError(f"pos_embed 'learned2d' needs an even dim, found dim {self.dim}")
        if self.pool in ("cls", "cls+mean") and not self.class_token:
            raise VitlabError(f"pool {self.pool!r} needs class_token=True; use pool='mean' without a class token")
        if self.dist_token and (not self.class_token or self.pool != "cls"):
            raise VitlabError(
                "dist_token needs class_token=True and pool='cls': DeiT's distillation token sits "
                f"after the class token; found class_token={self.class_token}, pool={self.pool!r}"
            )
        if self.dist_head and not self.dist_token:
            raise VitlabError("dist_head needs dist_token=True: the second head reads the distillation token")
        if self.no_embed_class and self.pos_embed != "learned":
            raise VitlabError(
                f"no_embed_class applies to the 1-D table (pos_embed 'learned'); pos_embed "
                f"{self.pos_embed!r} never gives the prefix tokens a position"
            )
        if self.stem == "hybrid" and (P & (P - 1)):
            raise VitlabError(f"stem 'hybrid' downsamples by powers of 2: patch_size must be one, found {P}")
        if self.dynamic_img_size and (self.pos_embed not in ("learned", "none") or self.stem != "patch"):
            raise VitlabError(
                "dynamic_img_size=True resamples the 1-D position table per image (pos_embed 'learned' or 'none', "
                f"stem 'patch'); found pos_embed {self.pos_embed!r}, stem {self.stem!r}",
                arg="dynamic_img_size",
            )
        if self.dynamic_img_pad and not self.dynamic_img_size:
            raise VitlabError(
                "dynamic_img_pad=True pads images of other sizes, which only dynamic_img_size=True takes; give both",
                arg="dynamic_img_pad",
            )

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token, the distillation token, the registers."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def num_pos_prefix_tokens(self) -> int:
        """Rows of the 1-D position table before the patches' rows: one per prefix token, none with
        `no_embed_class`."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim if self.mlp_dim is not None else int(self.dim * self.mlp_ratio)

    @property
    def use_fc_norm(self) -> bool:
        return self.pool == "mean" if self.fc_norm is None else self.fc_norm

    @property
    def use_dist_head(self) -> bool:
        return self.dist_token if self.dist_head is None else self.dist_head

    @property
    def pooled_dim(self) -> int:
        """Width of what the head reads: D, or 2D for pool 'cls+mean'."""
        return 2 * self.dim if self.pool == "cls+mean" else self.dim

    def describe(self) -> str:
        """One line: the size, and the options of the family that depart from the paper's model."""
        text = f"D={self.dim} L={self.depth} h={self.heads} P={self.patch_size} img={self.img_size[0]}"
        extras = [
            "no class token" if not self.class_token else "",
            "distillation token" if self.dist_token else "",
            f"{self.reg_tokens} registers" if self.reg_tokens else "",
            f"pool {self.pool}" if self.pool != "cls" else "",
            "LayerScale" if self.layer_scale is not None else "",
            "pre-norm" if self.pre_norm else "",
            "no qkv bias" if not self.qkv_bias else "",
            "QuickGELU" if self.act == "quick_gelu" else "",
            "no head" if self.num_classes == 0 else "",
            "any image size" if self.dynamic_img_size else "",
        ]
        extras = [e for e in extras if e]
        return text + (f" ({', '.join(extras)})" if extras else "")

    def replace(self, **overrides) -> ViTConfig:
        """A copy with some fields changed; an unknown field is an error that lists the valid ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise VitlabError(f"unknown ViTConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return ViTConfig(**{**asdict(self), **overrides})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        return d


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        for v in value:
            check_range(name, v, low=1, integer=True)
        return int(value[0]), int(value[1])
    raise VitlabError(f"{name} must be an integer or (height, width) of integers >= 1; found {value!r}", arg=name)


def _check_choice(name: str, value, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise VitlabError(f"{name} must be one of {', '.join(choices)}; found {value!r}", arg=name)


def _check_bool(name: str, value, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        raise VitlabError(f"{name} must be True or False{' (or None)' if optional else ''}; found {value!r}", arg=name)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 32) + 1) if n % k == 0]


# ----------------------------------------------------------------------------------------------------
# Position embeddings (Eq. 1's E_pos, and the alternatives of Appendix D.4)


def sincos_2d_embedding(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding: D/4 frequencies each for sin(y), cos(y), sin(x), cos(x).

    Returns (gh * gw, dim), rows in raster order (row-major over the patch grid).
    """
    gh, gw = grid_size
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # (D/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (N, D/4)
    x = x.flatten()[:, None] * omega[None, :]  # (N, D/4)
    return torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1).float()  # (N, D)


@torch.fx.wrap  # torch.fx records a call: a traced graph resamples for each real input's grid
def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    *,
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Section 3.2: "we perform 2D interpolation of the pre-trained position embeddings, according to
    their location in the original image". (1, prefix + gh*gw, D) -> (1, prefix + new_gh*new_gw, D).

    The prefix rows (class, distillation and register tokens; none with `no_embed_class`) are kept as
    they are; only the patch rows are resampled, as a D-channel image of the old grid (bicubic with
    antialiasing, as timm's resample_abs_pos_embed). Grids may be non-square; `old_grid` defaults to a
    square one. The same grid returns the table itself.
    """
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n, D = patches.shape[1], patches.shape[2]
    gh, gw = old_grid if old_grid is not None else (math.isqrt(n), math.isqrt(n))
    if old_grid is None and gh * gw != n:
        raise VitlabError(f"the position table has {n} patch rows, which is not a square grid; give old_grid")
    if gh * gw != n:
        raise VitlabError(f"old_grid {gh}x{gw} = {gh * gw} does not match the {n} patch rows of the position table")
    new_grid = (int(new_grid[0]), int(new_grid[1]))
    if (gh, gw) == new_grid:
        return pos_embed
    dtype = patches.dtype
    grid = patches.reshape(1, gh, gw, D).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    grid = F.interpolate(grid, size=new_grid, mode=interpolation, antialias=antialias, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(dtype)  # (1, N', D)
    return torch.cat([prefix, grid], dim=1)


def relative_position_index(grid_size: tuple[int, int]) -> torch.Tensor:
    """For every pair of patches (i, j), the index of their offset (dy, dx) in a (2gh-1)(2gw-1) table.

    Returns a (N, N) long tensor; offsets run from -(g-1) to g-1 and are shifted to start at 0.
    """
    gh, gw = grid_size
    coords = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N): offset of patch i from patch j
    dy, dx = rel[0] + gh - 1, rel[1] + gw - 1  # shift to [0, 2g-2]
    return dy * (2 * gw - 1) + dx  # (N, N)


class RelativePositionBias(nn.Module):
    """A learned bias per head for every 2-D offset between two patches, added to the attention logits.

    The prefix tokens have no position: their rows and columns get zero bias.
    """

    def __init__(self, grid_size: tuple[int, int], heads: int, num_prefix_tokens: int):
        super().__init__()
        gh, gw = grid_size
        self.num_prefix_tokens = num_prefix_tokens
        self.table = nn.Parameter(torch.zeros(heads, (2 * gh - 1) * (2 * gw - 1)))  # (h, #offsets)
        nn.init.trunc_normal_(self.table, std=0.02)
        self.register_buffer("index", relative_position_index(grid_size), persistent=False)  # (N, N)

    def forward(self) -> torch.Tensor:
        bias = self.table[:, self.index]  # (h, N, N)
        p = self.num_prefix_tokens
        return F.pad(bias, (p, 0, p, 0))  # (h, p+N, p+N): zero rows/columns for the prefix tokens


# ----------------------------------------------------------------------------------------------------
# Layers


class PatchEmbed(nn.Module):
    """x_p E of Eq. 1: cut the image into P x P patches and map each flattened patch linearly to D.

    `conv`: a Conv2d with kernel = stride = P, which is exactly that linear map applied per patch.
    `linear`: the literal reading, flatten each patch then nn.Linear. The flattening order is
    (C, P, P), the order of the Conv2d kernel, so the two share weights (weight.reshape(D, -1)).
    """

    def __init__(
        self,
        *,
        img_size: tuple[int, int],
        patch_size: int,
        in_chans: int,
        dim: int,
        mode: str = "conv",
        bias: bool = True,
        dynamic: bool = False,
        pad: bool = False,
    ):
        super().__init__()
        self.patch_size, self.mode, self.dynamic, self.pad = patch_size, mode, dynamic, pad
        self.set_input_size(img_size)
        P = patch_size
        if mode == "conv":
            self.proj = nn.Conv2d(in_chans, dim, kernel_size=P, stride=P, bias=bias)
        else:
            self.proj = nn.Linear(in_chans * P * P, dim, bias=bias)

    def set_input_size(self, img_size: tuple[int, int]) -> None:
        self.img_size = tuple(img_size)
        self.grid_size = (img_size[0] // self.patch_size, img_size[1] // self.patch_size)

    def feat_size(self, H, W) -> tuple:
        """The patch grid of an H x W image (timm's dynamic_feat_size): sides rounded up with `pad`."""
        P = self.patch_size
        return (-(-H // P), -(-W // P)) if self.pad else (H // P, W // P)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chans = self.proj.in_channels if self.mode == "conv" else self.proj.in_features // self.patch_size**2
        x = checked_images(x, chans, 1 if self.pad else self.patch_size, None if self.dynamic else self.img_size)
        if self.pad:  # timm's dynamic_img_pad: zeros on the right and at the bottom, up to multiples of P
            H, W = x.shape[-2:]
            x = F.pad(x, (0, (-W) % self.patch_size, 0, (-H) % self.patch_size))
        if self.mode == "conv":
            return self.proj(x).flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, N, D)
        B, C, H, W = x.shape
        P = self.patch_size
        gh, gw = H // P, W // P
        x = x.reshape(B, C, gh, P, gw, P)  # (B, C, gh, P, gw, P)
        x = x.permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * P * P)  # (B, N, C*P*P), raster order
        return self.proj(x)  # (B, N, D)


@torch.fx.wrap  # a traced graph checks each real input too
def checked_images(
    x: torch.Tensor, chans: int, patch_size: int, img_size: tuple[int, int] | None = None
) -> torch.Tensor:
    """`x` itself, once it is a float batch (B, chans, H, W) of the size the model takes: `img_size`, or
    (None, dynamic_img_size) any sides that are multiples of the patch size. Else one line saying what to do."""
    check_images(x, chans)
    H, W = x.shape[-2:]
    if img_size is not None and (H, W) != tuple(img_size):
        raise VitlabError(
            f"input image is {H}x{W} but the model was built for {img_size[0]}x{img_size[1]}; resize the input, "
            f"or build the model with img_size=({H}, {W}) (or dynamic_img_size=True) to resample the position embedding"
        )
    if H % patch_size or W % patch_size:
        raise VitlabError(
            f"input image is {H}x{W}: dynamic_img_size takes sides that are multiples of patch_size {patch_size}; "
            "resize the input, or add dynamic_img_pad=True to pad it"
        )
    return x


class HybridEmbed(nn.Module):
    """Section 3.1, "Hybrid Architecture": patches are taken from a CNN feature map instead of pixels.

    The ResNet-style stem (vitlab.models.cnn.ConvStem) downsamples by P, so its feature map has the same
    gh x gw grid as P x P patches would; the projection E is then a 1 x 1 patch (the paper's special case).
    """

    def __init__(self, *, img_size: tuple[int, int], patch_size: int, in_chans: int, dim: int, width: int):
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.backbone = ConvStem(in_chans=in_chans, width=width, downsample=patch_size)
        self.proj = nn.Conv2d(self.backbone.out_channels, dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.backbone.stem[0].in_channels)
        if tuple(x.shape[-2:]) != tuple(self.img_size):
            raise VitlabError(f"input image is {x.shape[-2]}x{x.shape[-1]} but the model was built for {self.img_size}")
        x = self.backbone(x)  # (B, C', gh, gw)
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


EXPLICIT_SLICE = 2**20  # logits per slice of the explicit path when no weights are returned (2 MiB in bf16)


@torch.fx.wrap  # its slicing depends on the batch's shape: torch.fx records one call, run on real tensors
def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    bias: torch.Tensor | None,
    dropout: float,
    whole: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5-7: softmax(q k^T / sqrt(d) + bias) v, and the weights (of the last slice; of all with `whole`).
    q (B, h, Q, d), k and v (B, h, N, d); `dropout` on the weights (0 at eval). Without `whole`, slices of
    the batch whose (b, h, Q, N) logits fit in cache; a compiler schedules the products itself (and a loop
    would only lengthen its graph)."""
    B, heads, Q, _ = q.shape
    N = k.shape[2]
    whole = whole or torch.compiler.is_compiling()
    rows = B if whole else max(1, EXPLICIT_SLICE // (heads * Q * N))
    outs = []
    for qs, ks, vs in zip(q.split(rows), k.split(rows), v.split(rows)):
        logits = (qs * scale) @ ks.transpose(-2, -1)  # (b, h, Q, N)
        if bias is not None:
            logits = logits + bias
        attn = logits.softmax(dim=-1)  # each row sums to 1 over the keys
        outs.append((F.dropout(attn, dropout) if dropout else attn) @ vs)  # (b, h, Q, d)
    return (torch.cat(outs) if len(outs) > 1 else outs[0]), attn  # (B, h, Q, d)


class Attention(nn.Module):
    """Multi-head self-attention (MSA), Appendix A Eq. 5-8.

    Two paths, one set of weights: `F.scaled_dot_product_attention` (fused, never materialises the
    N x N matrix) and the explicit softmax(q k^T / sqrt(d)) v, taken when the weights are wanted, and
    when `fused` is False (set by `VisionTransformer.set_fused_attention`).
    """

    def __init__(self, dim: int, heads: int, *, qkv_bias: bool = True, attn_dropout: float = 0.0, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5  # 1/sqrt(d): keeps the logits' variance at 1 (Eq. 5)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)  # U_qkv, all heads at once
        self.attn_drop = nn.Dropout(attn_dropout)
        self.proj = nn.Linear(dim, dim)  # U_msa of Eq. 8
        self.proj_drop = nn.Dropout(dropout)
        self.fused = True  # F.scaled_dot_product_attention unless the weights are wanted

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        return_attention: bool = False,
        queries: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`queries`: the output of the first `queries` tokens only (each still attends to all N)."""
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim)  # (B, N, 3, h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, N, d)
        if queries is not None:
            q = q[:, :, :queries]  # (B, h, Q, d)
            bias = bias[:, :queries] if bias is not None else None  # (h, Q, N)
        Q = q.shape[2]
        drop = self.attn_drop.p if self.training else 0.0
        if return_attention or not self.fused:
            out, attn = explicit_attention(
                q, k, v, scale=self.scale, bias=bias, dropout=drop, whole=return_attention
            )  # (B, h, Q, d), (B, h, Q, N)
            attn = attn if return_attention else None
        else:
            attn = None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop)  # (B, h, N, d)
        out = out.transpose(1, 2).reshape(B, Q, D)  # concatenate the heads: (B, Q, h*d)
        return self.proj_drop(self.proj(out)), attn


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's fast approximation of GELU, which its weights were trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """The MLP of Eq. 3: two layers with a GELU non-linearity (Section 3.1)."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0, act: str = "gelu"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = QuickGELU() if act == "quick_gelu" else nn.GELU()
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """A learned gain per channel on a residual branch, initialised small (CaiT, Touvron et al. 2021), so
    each block starts close to the identity; DINOv2 and DeiT III use it. The parameter is timm's `gamma`."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """One encoder layer: pre-LN, residual around each half (Eq. 2 and Eq. 3); with `layer_scale`, each
    branch is scaled by its LayerScale (`ls1`, `ls2`) before the residual sum."""

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0):
        super().__init__()
        scaled = cfg.layer_scale is not None
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(
            cfg.dim, cfg.heads, qkv_bias=cfg.qkv_bias, attn_dropout=cfg.attn_dropout, dropout=cfg.dropout
        )
        self.ls1 = LayerScale(cfg.dim, cfg.layer_scale) if scaled else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = Mlp(cfg.dim, cfg.hidden_dim, dropout=cfg.dropout, act=cfg.act)
        self.ls2 = LayerScale(cfg.dim, cfg.layer_scale) if scaled else nn.Identity()
        self.drop_path = StochasticDepth(drop_path, mode="row") if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        return_attention: bool = False,
        queries: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), bias, return_attention, queries)
        if queries is not None:
            x = x[:, :queries]  # (B, Q, D): the tokens whose output is wanted
        x = x + self.drop_path(self.ls1(y))  # Eq. 2: z' = MSA(LN(z)) + z
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # Eq. 3: z = MLP(LN(z')) + z'
        return x, attn


# ----------------------------------------------------------------------------------------------------
# The model


class VisionTransformer(nn.Module):
    """ViT: patch embedding, class token and position embedding (Eq. 1), L blocks (Eq. 2-3),
    LayerNorm and a linear head on the class token (Eq. 4).

    `forward(x)` returns logits (B, num_classes), or the pooled features (B, D) when num_classes=0.
    `forward(x, return_attention=True)` also returns the attention weights of every block, a list of
    (B, h, T, T) with T = prefix tokens + N patches (N+1 in the paper); `return_attention=[i, j]` only
    those of blocks i and j (one T x T matrix per chosen block is kept, the rest take the fast path).
    """

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = (cfg or ViTConfig()).replace(**overrides) if overrides else (cfg or ViTConfig())
        self.cfg = cfg
        self.pretrained_cfg = None  # a PretrainedCfg (preprocessing, labels), set by vitlab.create_model
        self.grad_checkpointing = False
        D = cfg.dim

        if cfg.stem == "hybrid":
            self.patch_embed = HybridEmbed(
                img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, dim=D, width=cfg.stem_width
            )
        else:
            self.patch_embed = PatchEmbed(
                img_size=cfg.img_size,
                patch_size=cfg.patch_size,
                in_chans=cfg.in_chans,
                dim=D,
                mode=cfg.patch_embed,
                bias=cfg.patch_bias,
                dynamic=cfg.dynamic_img_size,
                pad=cfg.dynamic_img_pad,
            )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None  # x_class
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.dist_token else None  # DeiT's x_dist
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None  # registers
        gh, gw = cfg.grid_size
        n_tokens = cfg.num_patches + cfg.num_pos_prefix_tokens
        self.pos_embed = self.pos_embed_row = self.pos_embed_col = self.rel_pos = None
        if (
            cfg.pos_embed == "learned"
        ):  # E_pos: one learned row per position, class token included (not with no_embed_class)
            self.pos_embed = nn.Parameter(torch.zeros(1, n_tokens, D))  # (1, p+N, D); (1, N, D) with no_embed_class
        elif cfg.pos_embed == "learned2d":  # Appendix D.4: X- and Y-embeddings of D/2 each, concatenated
            self.pos_embed_row = nn.Parameter(torch.zeros(1, gh, D // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(1, gw, D // 2))
        elif cfg.pos_embed == "sincos2d":  # fixed, not learned, not saved
            self.register_buffer("pos_embed_fixed", sincos_2d_embedding((gh, gw), D)[None], persistent=False)
        elif cfg.pos_embed == "relative":  # Appendix D.4: learned relative bias inside attention
            self.rel_pos = nn.ModuleList(
                RelativePositionBias((gh, gw), cfg.heads, cfg.num_prefix_tokens) for _ in range(cfg.depth)
            )
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.norm_pre = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()  # CLIP: LN(z_0)

        rates = [
            cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)
        ]  # stochastic depth grows with depth
        self.blocks = nn.ModuleList(Block(cfg, rate) for rate in rates)
        self.norm = nn.Identity() if cfg.use_fc_norm else nn.LayerNorm(D, eps=cfg.norm_eps)  # Eq. 4's LN
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.use_fc_norm else nn.Identity()
        self.head = nn.Linear(cfg.pooled_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = None  # DeiT's second head, on the distillation token
        if cfg.use_dist_head:
            self.head_dist = nn.Linear(D, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.init_weights()

    # --- initialisation ---------------------------------------------------------------------------

    def init_weights(self, mode: str = "trunc_normal", head_std: float = 0.0) -> None:
        """Initialise every weight, in one of two schemes (`INITS`):

        "trunc_normal" (what the constructor does): timm's truncated normal of std 0.02, here for every linear
            map, convolution and position table; zero biases.
        "jax" (the original release, big_vision and vit_jax's models_vit.py): Xavier-uniform linear maps,
            q, k and v each as its own D x D map; a LeCun-normal (truncated, variance 1/fan_in) patch
            projection; MLP biases N(0, 1e-6), other biases zero; position table N(0, 0.02); class token 0.

        Both: LayerNorm gain 1 and bias 0, and a zero head (Section 3.2: "we remove the pre-trained
        prediction head and attach a zero-initialized D x K feedforward layer"), or with `head_std` > 0 a
        truncated normal of that std (timm's 0.02). The two schemes agree in scale for ViT-B (D = 768:
        Xavier's std is 0.023-0.026), but for the small models trained here from random weights std 0.02
        is 4-6x below Xavier's (D = 64: 0.088-0.125) and a patch of 16-48 pixels gets 0.02 instead of
        0.14-0.25: such a model learns several times slower (docs/recipe.md measures it).
        """
        if mode not in INITS:
            raise VitlabError(f"init must be one of {', '.join(INITS)}; found {mode!r}", arg="init")
        check_range("head_init", head_std, low=0)
        for name, m in self.named_modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
                continue
            if not isinstance(m, (nn.Linear, nn.Conv2d)):
                continue
            if mode == "trunc_normal":  # the heads too (zeroed below): the random stream of every release so far
                nn.init.trunc_normal_(m.weight, std=0.02)
            elif name in ("head", "head_dist"):
                continue
            elif isinstance(m, nn.Conv2d) or name == "patch_embed.proj":  # LeCun normal, flax's Conv default
                std = m.weight[0].numel() ** -0.5 / 0.87962566103423978  # / the std of N(0, 1) truncated at +-2
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            elif name.endswith("attn.qkv"):  # (3D, D): q, k and v are three D x D maps in the release
                for part in m.weight.data.chunk(3, dim=0):
                    nn.init.xavier_uniform_(part)
            else:
                nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                if mode == "jax" and ".mlp." in f".{name}.":
                    nn.init.normal_(m.bias, std=1e-6)
                else:
                    nn.init.zeros_(m.bias)
        for p in (self.pos_embed, self.pos_embed_row, self.pos_embed_col):
            if p is not None:
                if mode == "jax":
                    nn.init.normal_(p, std=0.02)
                else:
                    nn.init.trunc_normal_(p, std=0.02)
        if self.cls_token is not None:
            if mode == "jax":
                nn.init.zeros_(self.cls_token)
            else:
                nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)  # as DeiT
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)  # as timm
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                if head_std > 0:
                    nn.init.trunc_normal_(head.weight, std=head_std)
                else:
                    nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    # --- Eq. 1-3 ----------------------------------------------------------------------------------

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos. (B, C, H, W) -> (B, p+N, D), p prefix
        tokens ([class, distillation, registers]; p = 1 in the paper)."""
        H, W = x.shape[-2:]
        x = self.patch_embed(x)  # (B, N, D)
        B, N, D = x.shape
        pos = self.pos_embed  # (1, p+N, D): the 1-D table, p = 0 with no_embed_class
        if pos is not None and self.cfg.dynamic_img_size:  # timm's dynamic_img_size: the table at this image's grid
            pos = resample_pos_embed(
                pos,
                self.patch_embed.feat_size(H, W),
                old_grid=self.cfg.grid_size,
                num_prefix_tokens=self.cfg.num_pos_prefix_tokens,
            )
        if pos is None or self.cfg.no_embed_class:  # tables of the patches only: the 2-D ones, and the
            patch_pos = pos if pos is not None else self.patch_pos_embed()  # 1-D one without prefix rows
            if patch_pos is not None:
                x = x + patch_pos
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if prefix:
            x = torch.cat([*prefix, x], dim=1)  # (B, p+N, D)
        if pos is not None and not self.cfg.no_embed_class:  # the paper's 1-D table covers the class token too
            x = x + pos
        return self.norm_pre(self.pos_drop(x))

    def patch_pos_embed(self) -> torch.Tensor | None:
        """The position embedding of the patches alone, (1, N, D), raster order; None for `relative`/`none`."""
        if self.pos_embed is not None:
            return self.pos_embed[:, self.cfg.num_pos_prefix_tokens :]  # (1, N, D): the prefix rows dropped
        if self.pos_embed_row is not None:
            gh, gw = self.cfg.grid_size
            rows = self.pos_embed_row[:, :, None, :].expand(-1, gh, gw, -1)  # (1, gh, gw, D/2): Y-embedding
            cols = self.pos_embed_col[:, None, :, :].expand(-1, gh, gw, -1)  # (1, gh, gw, D/2): X-embedding
            return torch.cat([rows, cols], dim=-1).reshape(1, gh * gw, -1)  # (1, N, D)
        return getattr(self, "pos_embed_fixed", None)

    def forward_features(
        self, x: torch.Tensor, return_attention: bool | Iterable[int] = False, class_token_only: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Eq. 1-3 and the final LayerNorm: (B, C, H, W) -> (B, p+N, D), plus attention if asked.

        `class_token_only`: the last block computes the outputs of the tokens a head reads alone (the
        class token, and a DeiT model's distillation token), (B, 1 or 2, D), all that Eq. 4 reads: its
        MSA still attends to every token, but the other tokens' queries, projections and MLPs, ~3/4 of
        the block's arithmetic, are skipped. `forward` does this for pool="cls"; a model without a class
        token runs every token.
        """
        wanted = self._attention_layers(return_attention)
        x = self.embed(x)
        attns = []
        last = len(self.blocks) - 1
        n_read = 2 if self.head_dist is not None else 1  # the tokens forward_head reads: class (and distillation)
        for i, block in enumerate(self.blocks):
            bias = self.rel_pos[i]().to(x.dtype) if self.rel_pos is not None else None  # (h, p+N, p+N)
            queries = (
                n_read if class_token_only and self.cls_token is not None and i == last and i not in wanted else None
            )
            if self.grad_checkpointing and self.training and i not in wanted:
                x, _ = checkpoint(block, x, bias, False, queries, use_reentrant=False)  # recompute in backward
            else:
                x, attn = block(x, bias, i in wanted, queries)
                if attn is not None:
                    attns.append(attn)
        x = self.norm(x)
        return (x, attns) if return_attention is not False else x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Eq. 4: pool the tokens (class token, or the mean of the patch tokens), then the head.
        A DeiT model averages its two heads, on the class and on the distillation token."""
        p = self.cfg.num_prefix_tokens
        if self.cfg.pool == "cls":
            pooled = x[:, 0]  # z_L^0: (B, D)
        elif self.cfg.pool == "mean":
            pooled = x[:, p:].mean(dim=1)  # (B, D): average over patches, prefix tokens left out
        else:  # "cls+mean", DINOv2's linear probe
            pooled = torch.cat([x[:, 0], x[:, p:].mean(dim=1)], dim=-1)  # (B, 2D)
        pooled = self.fc_norm(pooled)
        if self.head_dist is None:
            return pooled if pre_logits else self.head(pooled)
        x_dist = x[:, 1]  # (B, D): the distillation token
        if pre_logits:
            return (pooled + x_dist) / 2
        return (self.head(pooled) + self.head_dist(x_dist)) / 2  # DeiT Section 5: the mean of both heads' outputs

    def forward(
        self, x: torch.Tensor, return_attention: bool | Iterable[int] = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        if isinstance(return_attention, torch.fx.Proxy):  # torch.fx makes every argument an input of its graph:
            torch._assert(  # the traced graph is the classifier (concrete_args={"return_attention": True}: the maps)
                return_attention == False,  # noqa: E712 (an fx node, not a Python comparison)
                "a graph traced by torch.fx returns logits; trace with concrete_args={'return_attention': True}",
            )
            return_attention = False
        class_token_only = self.cfg.pool == "cls"  # Eq. 4 reads z_L^0 alone
        if return_attention is False:
            return self.forward_head(self.forward_features(x, class_token_only=class_token_only))
        features, attns = self.forward_features(x, return_attention, class_token_only=class_token_only)
        return self.forward_head(features), attns

    def _attention_layers(self, return_attention: bool | Iterable[int]) -> set[int]:
        if return_attention is False:
            return set()
        if return_attention is True:
            return set(range(len(self.blocks)))
        layers = {int(i) if int(i) >= 0 else len(self.blocks) + int(i) for i in return_attention}
        bad = sorted(i for i in layers if not 0 <= i < len(self.blocks))
        if bad:
            raise VitlabError(
                f"return_attention asks for layer(s) {bad}; this model has layers 0..{len(self.blocks) - 1}"
            )
        return layers

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """timm's forward_intermediates: the outputs of some blocks, z_l, for dense heads and probes
        (timm's features_only models call it, `vitlab.create_model(name, features_only=True)` too).

        indices: the last n blocks (an int), the blocks named (negative from the end), or all (None).
        norm: pass each through the final LayerNorm. output_fmt: "NCHW", the patch tokens as a
        (B, D, gh, gw) map, or "NLC", (B, N, D). return_prefix_tokens: each as (patches, (B, p, D) prefix).
        stop_early: run the blocks up to the last one taken only.
        Returns the list, with `intermediates_only`; else (forward_features' output, the list).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise VitlabError(f"output_fmt must be 'NCHW' or 'NLC'; found {output_fmt!r}", arg="output_fmt")
        take = self._block_indices(indices)
        H, W = x.shape[-2:]
        gh, gw = self.patch_embed.feat_size(H, W) if self.cfg.dynamic_img_size else self.cfg.grid_size
        x = self.embed(x)  # (B, p+N, D)
        B, p = x.shape[0], self.cfg.num_prefix_tokens
        outs = []
        last = max(take) if stop_early else len(self.blocks) - 1
        for i, block in enumerate(self.blocks[: last + 1]):
            bias = self.rel_pos[i]().to(x.dtype) if self.rel_pos is not None else None  # (h, p+N, p+N)
            if self.grad_checkpointing and self.training:
                x, _ = checkpoint(block, x, bias, use_reentrant=False)
            else:
                x, _ = block(x, bias)
            if i in take:
                y = self.norm(x) if norm else x
                patches = y[:, p:]  # (B, N, D)
                if output_fmt == "NCHW":
                    patches = patches.reshape(B, gh, gw, -1).permute(0, 3, 1, 2).contiguous()  # (B, D, gh, gw)
                outs.append((patches, y[:, :p]) if return_prefix_tokens and p else patches)  # timm's: no pairs at p=0
        if intermediates_only:
            return outs
        return self.norm(x), outs

    @property
    def feature_info(self) -> list[dict]:
        """timm's feature_info: what each block gives forward_intermediates, D channels at stride P."""
        return [
            dict(module=f"blocks.{i}", num_chs=self.cfg.dim, reduction=self.cfg.patch_size)
            for i in range(len(self.blocks))
        ]

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's: drop the blocks after the last of `indices` (and the final norm with `prune_norm`, the
        pooling's norm and the head with `prune_head`), for a model that only gives intermediates. Returns
        the indices kept, from the first block, which forward_intermediates then takes."""
        take = sorted(self._block_indices(indices))
        depth = take[-1] + 1
        self.blocks = self.blocks[:depth]
        if self.rel_pos is not None:
            self.rel_pos = self.rel_pos[:depth]
        changes = {"depth": depth}
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.head = nn.Identity()
            self.head_dist = nn.Identity() if self.head_dist is not None else None
            changes["num_classes"] = 0
        self.cfg = self.cfg.replace(**changes)
        return take

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        """timm's set_input_size: build for another image size, the 1-D position table resampled once
        (Section 3.2), as create_model(..., img_size=...) does when it loads weights."""
        if patch_size is not None and patch_size != self.cfg.patch_size:
            raise VitlabError(
                f"patch_size {patch_size}: set_input_size changes the image size only (the patch size is "
                f"{self.cfg.patch_size}); build the model with patch_size={patch_size}",
                arg="patch_size",
            )
        if img_size is None:
            return
        if self.cfg.pos_embed not in ("learned", "none") or self.cfg.stem != "patch":
            raise VitlabError(
                f"set_input_size resamples the 1-D position table (pos_embed 'learned' or 'none', stem 'patch'); "
                f"found pos_embed {self.cfg.pos_embed!r}, stem {self.cfg.stem!r}: build the model at img_size instead",
                arg="img_size",
            )
        old_grid = self.cfg.grid_size
        self.cfg = self.cfg.replace(img_size=img_size)  # checked: sides that are multiples of the patch size
        self.patch_embed.set_input_size(self.cfg.img_size)
        if self.pos_embed is not None:
            table = resample_pos_embed(
                self.pos_embed.data,
                self.cfg.grid_size,
                old_grid=old_grid,
                num_prefix_tokens=self.cfg.num_pos_prefix_tokens,
            )
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        if self.pretrained_cfg is not None:
            self.pretrained_cfg = self.pretrained_cfg.replace(input_size=(self.cfg.in_chans, *self.cfg.img_size))

    def _block_indices(self, indices: int | Sequence[int] | None) -> set[int]:
        """timm's feature_take_indices: None all blocks, n the last n, a sequence those (negative from the end)."""
        L = len(self.blocks)
        if indices is None:
            return set(range(L))
        if isinstance(indices, int):
            if not 0 < indices <= L:
                raise VitlabError(f"indices {indices}: expected the number of last blocks, 1..{L}", arg="indices")
            return set(range(L - indices, L))
        take = {int(i) % L if -L <= int(i) < L else int(i) for i in indices}
        bad = sorted(i for i in take if not 0 <= i < L)
        if bad or not take:
            raise VitlabError(f"indices {list(indices)}: this model has blocks 0..{L - 1}", arg="indices")
        return take

    # --- fine-tuning helpers (timm's API) ---------------------------------------------------------

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    @property
    def num_features(self) -> int:
        """D, the width of the tokens forward_features returns (timm's num_features)."""
        return self.cfg.dim

    @property
    def head_hidden_size(self) -> int:
        """The width of what the head reads, forward_head(pre_logits=True): D, or 2D for pool 'cls+mean'."""
        return self.cfg.pooled_dim

    @property
    def num_prefix_tokens(self) -> int:
        return self.cfg.num_prefix_tokens

    @property
    def default_cfg(self):
        """timm's older name of `pretrained_cfg`, which timm's tests and scripts still read."""
        return self.pretrained_cfg

    @property
    def global_pool(self) -> str:
        """The pooling under timm's name: "token" (the class token, Eq. 4) or "avg" (the mean of the patches)."""
        return {"cls": "token", "mean": "avg"}.get(self.cfg.pool, self.cfg.pool)

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The head (nn.Identity without classes); a DeiT model's two heads, as timm's distilled ViT."""
        return self.head if self.head_dist is None else (self.head, self.head_dist)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new zero-initialised head for `num_classes` classes (Section 3.2); a DeiT model gets two;
        0: no head, the model returns the pooled features. `global_pool` (timm's "token" or "avg") changes
        the pooling too, the final LayerNorm staying where it is (its weights are the model's)."""
        check_range("num_classes", num_classes, low=0, integer=True)
        changes = {"num_classes": num_classes}
        if global_pool is not None:
            pools = {"token": "cls", "avg": "mean"}
            if global_pool not in pools:
                raise VitlabError(
                    f"global_pool must be 'token' or 'avg' (pool 'cls' or 'mean'); found {global_pool!r}",
                    arg="global_pool",
                )
            changes.update(pool=pools[global_pool], fc_norm=self.cfg.use_fc_norm)
        self.cfg = self.cfg.replace(**changes)
        weight = next(self.parameters())
        new = lambda width: nn.Linear(width, num_classes) if num_classes > 0 else nn.Identity()  # noqa: E731
        self.head = new(self.cfg.pooled_dim)
        self.head_dist = new(self.cfg.dim) if self.cfg.use_dist_head else None
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
                head.to(device=weight.device, dtype=weight.dtype).train(self.training)

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups (layer-wise learning-rate decay): the embedding, then each block, then the
        final norm and the head."""
        return dict(
            stem=r"^cls_token|^dist_token|^reg_token|^pos_embed|^patch_embed|^norm_pre|^rel_pos",
            blocks=r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    def no_weight_decay(self) -> set[str]:
        """Parameter names that should not be decayed: the prefix tokens, the position tables."""
        names = {"cls_token", "dist_token", "reg_token", "pos_embed", "pos_embed_row", "pos_embed_col"}
        names |= {n for n, _ in self.named_parameters() if n.startswith("rel_pos.")}
        return {n for n in names if n in dict(self.named_parameters())}

    def set_fused_attention(self, enable: bool = True) -> None:
        """Attention by `F.scaled_dot_product_attention` (True, the default) or by the explicit products
        of Eq. 5-7 (False); the same numbers to float rounding. Attention weights, when asked for, always
        come from the explicit path."""
        for block in self.blocks:
            block.attn.fused = enable

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass: less memory, ~30% more compute."""
        self.grad_checkpointing = enable

    def __prepare_scriptable__(self):
        raise VitlabError(
            "torch.jit.script: vitlab's ViT is not TorchScript (its forward takes Python options and checks its "
            "input in Python); use torch.fx.symbolic_trace(model), torch.jit.trace(model, example) or "
            "torch.export.export(model, (example,))"
        )

    # --- loading ------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As nn.Module.load_state_dict, but a position table of the wrong length gets a message that
        says what was expected, what was found and how to fix it (a common error when a checkpoint
        trained at another resolution is loaded)."""
        if self.pos_embed is not None and "pos_embed" in state_dict:
            found = tuple(state_dict["pos_embed"].shape)
            expected = tuple(self.pos_embed.shape)
            if found != expected:
                n_exp, n_found = expected[1], found[1] if len(found) == 3 else found[0]
                raise VitlabError(
                    f"pos_embed has {n_found} rows but this model expects {n_exp} "
                    f"({self.cfg.num_patches} patches for {self.cfg.img_size[0]}x{self.cfg.img_size[1]} images with "
                    f"patch {self.cfg.patch_size}, + {self.cfg.num_pos_prefix_tokens} rows for the prefix tokens); "
                    "resample it with vitlab.weights.resample_pos_embed, "
                    "or build the model at the checkpoint's img_size"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def count_parameters(model: nn.Module) -> int:
    """The number of parameters of `model`, trainable or not (Table 1's "Params" column)."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "ViTConfig",
    "PatchEmbed",
    "HybridEmbed",
    "Attention",
    "Mlp",
    "QuickGELU",
    "LayerScale",
    "Block",
    "VisionTransformer",
    "RelativePositionBias",
    "sincos_2d_embedding",
    "relative_position_index",
    "count_parameters",
]
