"""What a ViT costs: parameters per component, FLOPs per image, training memory (`vitlab info`).

Counting conventions (FLOP counts of ViTs are often miscounted: MACs called FLOPs, the attention
products skipped, fused attention kernels not seen by counters):
- A MAC is one multiply-accumulate; FLOPs = 2 x MACs. torchvision and fvcore print MACs and call
  them "GFLOPS"; `torch.utils.flop_counter.FlopCounterMode` prints FLOPs. Both are given here.
- Counted: every matrix product, the two attention products QK^T and AV included (each T^2 d per head,
  so T^2 D per layer), the patch projection and the head. Not counted: LayerNorm, softmax, GELU,
  residual adds and the position-embedding add (elementwise, O(T D), under 1% of the total).

Per image, with T = N + 1 tokens, D width, M MLP width, L layers, K classes (Eq. 1-4, Appendix A):

    patch embedding      N * (C P^2) * D                  Eq. 1, x_p E
    qkv projection       L * T * D * 3D                   Eq. 5, U_qkv
    attention QK^T       L * T^2 * D                      Eq. 6, all heads together: h * T^2 * (D/h)
    attention AV         L * T^2 * D                      Eq. 7
    output projection    L * T * D * D                    Eq. 8, U_msa
    MLP                  L * 2 * T * D * M                Eq. 3
    head                 D * K                            Eq. 4

ViT-B/16 at 224 comes to 17.56 GMACs (the paper's tables count the same; torchvision prints "17.56").
The attention products grow as T^2 D while everything else grows as T D^2: self-attention is
O(N^2 D) in the number of patches, and `patch_size_tradeoff` makes it concrete.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitlab.errors import check_range
from vitlab.models.factory import create_model
from vitlab.models.registry import get_config, get_variant
from vitlab.models.size import (
    BYTES_FP32,
    MemoryEstimate,
    activation_elements,
    check_fits,
    training_memory,
    vit_parameters,
)
from vitlab.models.vit import VisionTransformer, ViTConfig

# The paper's Table 1 (Base, Large, Huge), with the paper's rounded sizes.
TABLE1 = (
    ("ViT-Base", "vit_base_patch16_224", "86M"),
    ("ViT-Large", "vit_large_patch16_224", "307M"),
    ("ViT-Huge", "vit_huge_patch14_224", "632M"),
)


# ----------------------------------------------------------------------------------------------------
# Parameters


def build_on_meta(cfg: ViTConfig) -> VisionTransformer:
    """The model with shapes only (device "meta"): instant and free even for ViT-H."""
    with torch.device("meta"):
        return VisionTransformer(cfg)


def _component(name: str) -> str:
    if name.startswith("patch_embed."):
        return "patch_embed"
    if name in (
        "cls_token",
        "dist_token",
        "reg_token",
        "pos_embed",
        "pos_embed_row",
        "pos_embed_col",
    ) or name.startswith("rel_pos."):
        return "cls_token + pos_embed"  # every prefix token (class, distillation, registers) with the positions
    if name.startswith("blocks."):
        return "blocks"
    if name.startswith(("norm.", "fc_norm.", "norm_pre.")):
        return "norm"
    if name.startswith(("head.", "head_dist.")):
        return "head"
    return "other"


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters per component of Eq. 1-4: patch_embed, cls_token + pos_embed, blocks, norm, head
    (in that order; `total` last). Components the model lacks are reported as 0."""
    out = {k: 0 for k in ("patch_embed", "cls_token + pos_embed", "blocks", "norm", "head")}
    for name, p in model.named_parameters():
        key = _component(name)
        out[key] = out.get(key, 0) + p.numel()
    out["total"] = sum(out.values())
    return out


def block_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters of one encoder block: attention (qkv + proj), MLP (fc1 + fc2), the two LayerNorms, and
    LayerScale's two gains where the model has them."""
    block = model.blocks[0]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    out = {"attn": count(block.attn), "mlp": count(block.mlp), "norms": count(block.norm1) + count(block.norm2)}
    if count(block.ls1):
        out["layer scale"] = count(block.ls1) + count(block.ls2)
    return out


# ----------------------------------------------------------------------------------------------------
# FLOPs


@dataclass
class FlopCount:
    """MACs per image, by component (see the module docstring for what each row counts)."""

    rows: dict[str, int]
    note: str = ""

    @property
    def macs(self) -> int:
        return sum(self.rows.values())

    @property
    def flops(self) -> int:
        return 2 * self.macs

    @property
    def attention_macs(self) -> int:
        """The two products that grow with T^2: QK^T and AV."""
        return self.rows.get("attention QK^T", 0) + self.rows.get("attention AV", 0)


def count_macs(cfg: ViTConfig) -> FlopCount:
    """Analytic MACs per image of a ViT (Eq. 1-4 and Appendix A). The hybrid stem's convolutions are
    counted by torch's FlopCounterMode on a shape-only copy (they do not follow one formula)."""
    N, T = cfg.num_patches, cfg.num_patches + cfg.num_prefix_tokens
    D, M, L, K, P, C = cfg.dim, cfg.hidden_dim, cfg.depth, cfg.num_classes, cfg.patch_size, cfg.in_chans
    rows: dict[str, int] = {}
    note = ""
    if cfg.stem == "hybrid":
        rows["hybrid CNN stem"] = _hybrid_stem_macs(cfg)
        rows["patch embedding (1x1)"] = N * build_on_meta(cfg.replace(depth=1)).patch_embed.backbone.out_channels * D
        note = "hybrid stem measured with FlopCounterMode"
    else:
        rows["patch embedding"] = N * (C * P * P) * D  # one (C P^2) x D map per patch
    rows["qkv projection"] = L * T * D * 3 * D
    rows["attention QK^T"] = L * T * T * D  # h heads x T^2 x d, d = D/h
    rows["attention AV"] = L * T * T * D
    rows["output projection"] = L * T * D * D
    rows["MLP"] = L * 2 * T * D * M
    rows["head"] = cfg.pooled_dim * K + (D * K if cfg.use_dist_head else 0)  # DeiT: a second head
    return FlopCount(rows, note)


def _hybrid_stem_macs(cfg: ViTConfig) -> int:

    stem = build_on_meta(cfg.replace(depth=1)).patch_embed.backbone
    x = torch.empty(1, cfg.in_chans, *cfg.img_size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        stem(x)
    return counter.get_total_flops() // 2


def measured_flops(model: nn.Module, img_size: tuple[int, int], in_chans: int = 3) -> tuple[int, dict[str, int]]:
    """FLOPs of one forward pass at batch 1 as torch's FlopCounterMode counts them (convolutions,
    matrix products, and the attention kernels it knows). Returns (total FLOPs, {op: FLOPs}).

    Use a model built on "meta" (`build_on_meta`): there `scaled_dot_product_attention` runs as its
    math decomposition, whose two matmuls (QK^T, AV) the counter sees. On CPU, torch 2.14 dispatches
    to `_scaled_dot_product_flash_attention_for_cpu`, which the counter does not count at all: the
    attention products silently vanish from the total (the "SDPA not counted" pitfall).

    The count is that of the network as the paper writes it, every token through every block
    (`forward_head(forward_features(x))`); the model's `forward` skips the last block's work for the
    tokens other than the class token, ~6% of ViT-B/16's.
    """

    device = next(model.parameters()).device
    x = torch.zeros(1, in_chans, *img_size, device=device)
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            _full_forward(model, x)
    finally:
        model.train(was_training)
    by_op = {str(op).split(".")[-1]: int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), by_op


def scaled_measured_flops(cfg: ViTConfig) -> int:
    """`measured_flops` of the whole model from copies of one and two blocks on the meta device: every block
    does the same work, so FLOPs(L) = FLOPs(1) + (L - 1) (FLOPs(2) - FLOPs(1)), exactly. The cost is that of
    two small models whatever the depth (the counter spends ~10 ms a block)."""
    one, _ = measured_flops(build_on_meta(cfg.replace(depth=1)), cfg.img_size, cfg.in_chans)
    if cfg.depth == 1:
        return one
    two, _ = measured_flops(build_on_meta(cfg.replace(depth=2)), cfg.img_size, cfg.in_chans)
    return one + (cfg.depth - 1) * (two - one)


# ----------------------------------------------------------------------------------------------------
# Memory (the estimates live in vitlab.models.size, where create_model checks them)


def _full_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits with every token through every block (what the analytic counts describe)."""
    if isinstance(model, VisionTransformer):
        return model.forward_head(model.forward_features(x))
    return model(x)


def measure_saved_activations(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one training forward pass and
    loss (parameters excluded), every token through every block: the measured counterpart of
    `training_memory(...).activations`."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in param_ptrs:
            saved[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(_full_forward(model, x), y)
    return sum(saved.values())


# ----------------------------------------------------------------------------------------------------
# Table 1 and the O(N^2 D) cost of attention, made concrete


def seed_table() -> list[dict]:
    """Base / Large / Huge as in the paper's Table 1, parameters counted here."""
    rows = []
    for label, name, paper in TABLE1:
        cfg = get_config(name)
        params = sum(p.numel() for p in build_on_meta(cfg).parameters())
        rows.append(
            {
                "model": label,
                "name": name,
                "layers": cfg.depth,
                "dim": cfg.dim,
                "mlp": cfg.hidden_dim,
                "heads": cfg.heads,
                "params": params,
                "paper": paper,
            }
        )
    return rows


def patch_size_tradeoff(cfg: ViTConfig, img_size: int = 224, patches: tuple[int, int] = (16, 8)) -> list[dict]:
    """Self-attention's O(N^2 D) cost: the same width and depth at `img_size` with two patch sizes.
    Halving P gives 4x the patches, ~16x the attention products and ~4x everything else."""
    rows = []
    for P in patches:
        c = cfg.replace(img_size=img_size, patch_size=P, stem="patch")
        count = count_macs(c)
        rows.append(
            {
                "patch": P,
                "N": c.num_patches,
                "T": c.num_patches + c.num_prefix_tokens,
                "attention_macs": count.attention_macs,
                "macs": count.macs,
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------------
# The report `vitlab info` prints


def _si(n: float, unit: str = "") -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _bytes(n: float) -> str:
    for scale, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}"
    return f"{n:.0f} B"


def info_report(
    name: str,
    *,
    img_size: int | None = None,
    patch_size: int | None = None,
    batch_size: int = 64,
    dim: int | None = None,
    depth: int | None = None,
    heads: int | None = None,
) -> str:
    """The text of `vitlab info NAME`: parameters, tokens, FLOPs, memory, the paper's Table 1 and the
    patch-size trade-off. Every size is checked before anything is built."""
    for arg, value in (
        ("img_size", img_size),
        ("patch_size", patch_size),
        ("batch_size", batch_size),
        ("dim", dim),
        ("depth", depth),
        ("heads", heads),
    ):
        check_range(arg, value, low=1, integer=True, optional=True)
    if not get_variant(name).is_vit:
        return _cnn_report(name, img_size or 32, batch_size)
    cfg = get_config(name, img_size=img_size, patch_size=patch_size, dim=dim, depth=depth, heads=heads)
    check_fits(cfg, what=name)  # counted from the config: a size no machine here could hold is one line
    params = vit_parameters(cfg)  # analytic; every block is the same, so only one and two are built below
    block = block_breakdown(build_on_meta(cfg.replace(depth=1)))
    count = count_macs(cfg)
    measured = scaled_measured_flops(cfg)
    mem = training_memory(cfg, batch_size, params["total"])
    H, W = cfg.img_size
    gh, gw = cfg.grid_size
    T = cfg.num_patches + cfg.num_prefix_tokens

    lines = [
        f"{name}: D={cfg.dim} L={cfg.depth} h={cfg.heads} (d={cfg.dim // cfg.heads}) MLP={cfg.hidden_dim} "
        f"P={cfg.patch_size} img={H}x{W} classes={cfg.num_classes} pos_embed={cfg.pos_embed} pool={cfg.pool}",
        "",
        "Parameters",
    ]
    for key in ("patch_embed", "cls_token + pos_embed", "blocks", "norm", "head"):
        extra = ""
        if key == "blocks":
            parts = ", ".join(f"{part} {n:,}" for part, n in block.items())
            extra = f"  ({cfg.depth} x {sum(block.values()):,}: {parts})"
        lines.append(f"  {key:<24}{params[key]:>14,}{extra}")
    if params.get("other"):
        lines.append(f"  {'other':<24}{params['other']:>14,}")
    lines.append(f"  {'total':<24}{params['total']:>14,}")
    tokens = (
        ("class", cfg.class_token),
        ("distillation", cfg.dist_token),
        (f"{cfg.reg_tokens} registers", cfg.reg_tokens),
    )
    prefix = ", ".join(kind for kind, present in tokens if present) or "none"
    lines += [
        "",
        f"Sequence: {gh}x{gw} = {cfg.num_patches} patches + {cfg.num_prefix_tokens} prefix ({prefix}) = {T} tokens",
        "",
        "Compute per image (1 MAC = one multiply-add; FLOPs = 2 x MACs)",
    ]
    for key, macs in count.rows.items():
        lines.append(f"  {key:<24}{_si(macs, 'MACs'):>14}  {100 * macs / count.macs:5.1f}%")
    lines.append(f"  {'total':<24}{_si(count.macs, 'MACs'):>14}  = {_si(count.flops, 'FLOPs')}")
    lines.append(
        f"  torch FlopCounterMode: {_si(measured, 'FLOPs')} "
        f"(analytic / counted = {count.flops / measured:.4f}; it skips LayerNorm, softmax, GELU too)"
    )
    if count.note:
        lines.append(f"  ({count.note})")
    lines += [
        "",
        f"Training memory at batch {batch_size} (fp32, AdamW)",
        f"  weights                 {_bytes(mem.weights):>12}",
        f"  grads + AdamW moments   {_bytes(mem.optimizer_state):>12}",
        f"  activations (fused)     {_bytes(mem.activations):>12}  "
        f"(per image per block: ~T x (8D + 2M) floats = {T} x {8 * cfg.dim + 2 * cfg.hidden_dim})",
        f"  total                   {_bytes(mem.total):>12}",
        f"  + attention matrices    {_bytes(mem.attention_matrices):>12}  "
        f"if the explicit path keeps softmax(QK^T/sqrt(d)): L x h x T^2 floats per image",
        "",
    ]
    lines.append("The paper's Table 1, parameters counted at 224 px with 1000 classes")
    lines.append(f"  {'model':<10}{'layers':>7}{'D':>6}{'MLP':>6}{'heads':>6}{'params':>14}{'paper':>7}")
    for r in seed_table():
        lines.append(
            f"  {r['model']:<10}{r['layers']:>7}{r['dim']:>6}{r['mlp']:>6}{r['heads']:>6}"
            f"{r['params']:>14,}{r['paper']:>7}"
        )
    a, b = patch_size_tradeoff(cfg)
    lines += [
        "",
        f"Self-attention is O(N^2 D): this width and depth at 224 px, patch {a['patch']} vs {b['patch']}",
        f"  {'patch':<7}{'N':>6}{'N+1':>6}{'QK^T + AV':>16}{'whole model':>16}",
    ]
    for r in (a, b):
        lines.append(
            f"  {r['patch']:<7}{r['N']:>6}{r['T']:>6}{_si(r['attention_macs'], 'MACs'):>16}{_si(r['macs'], 'MACs'):>16}"
        )
    lines.append(
        f"  {b['N'] // a['N']}x the patches -> {b['attention_macs'] / a['attention_macs']:.1f}x the attention "
        f"products and {b['macs'] / a['macs']:.1f}x the whole model's MACs"
    )
    return "\n".join(lines)


def _cnn_report(name: str, img_size: int, batch_size: int) -> str:
    with torch.device("meta"):
        model = create_model(name, img_size=img_size)
    total = sum(p.numel() for p in model.parameters())
    measured, _ = measured_flops(model, (img_size, img_size), 3)
    lines = [f"{name}: a CNN baseline (vitlab.models.cnn.ResNetMini), {img_size}x{img_size} input", "", "Parameters"]
    for child_name, child in model.named_children():
        lines.append(f"  {child_name:<24}{sum(p.numel() for p in child.parameters()):>14,}")
    lines += [
        f"  {'total':<24}{total:>14,}",
        "",
        f"Compute per image (torch FlopCounterMode): {_si(measured / 2, 'MACs')} = {_si(measured, 'FLOPs')}",
        f"Weights + grads + AdamW moments: {_bytes(16 * total)} (batch {batch_size}: activations not estimated "
        "for CNNs)",
    ]
    return "\n".join(lines)


__all__ = [
    "FlopCount",
    "MemoryEstimate",
    "parameter_breakdown",
    "block_breakdown",
    "count_macs",
    "measured_flops",
    "activation_elements",
    "training_memory",
    "measure_saved_activations",
    "seed_table",
    "patch_size_tradeoff",
    "info_report",
    "build_on_meta",
    "scaled_measured_flops",
    "BYTES_FP32",
]
