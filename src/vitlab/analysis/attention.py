"""What a ViT attends to: attention maps, attention rollout, the analyses of the paper's Figure 7, and
the token norms of "Vision Transformers Need Registers" (Darcet et al. 2023).

Everything here reads the model's explicit attention path (`softmax(q k^T / sqrt(d))`, Appendix A
Eq. 5-7) per call, through `model.forward_features(x, return_attention=[...])`. The model's default
fast path (fused `scaled_dot_product_attention`) is never switched off and nothing global changes, so
the maps survive fused attention (a fused kernel never materialises the attention matrix, which is
why hooks on it often return nothing).

Memory: one layer's attention is B x h x T^2 floats (T = prefix tokens + N patches), 16 MB per image for ViT-B/16 at 384
(577 tokens, 12 heads), 192 MB for all twelve layers. `iter_attention` therefore runs the images in
chunks and the layers in groups sized to `max_bytes`, and moves each chunk's maps off the GPU; the
analyses (rollout, distances, boundary share) reduce each chunk before the next one runs.

Token order: the prefix tokens first (class, distillation, registers: `cfg.num_prefix_tokens` of them,
one in the paper), then the N patches in raster order (row-major over the gh x gw grid), as `PatchEmbed`
produces them. A CLS-to-patch row is therefore `attn[..., 0, prefix:]`, reshaped to (gh, gw): row
index = image row, column index = image column. A DeiT model's distillation token and a DINOv2 model's
registers are prefix tokens: they are never drawn as patches, and the attention a row gives them is
what its patch map does not sum to.

Functions
- `attention_maps(model, images, layers=...)`  -> {layer: (B, h, T, T)}
- `cls_attention(model, images, layers=...)`  -> {layer: (B, h, gh, gw)}, the CLS row on the grid
- `attention_rollout(attns, ...)` / `rollout(model, images, ...)`  (Abnar & Zuidema 2020; Figure 6)
- `attention_distance(attn, ...)` / `mean_attention_distance(model, images)`  (Figure 7, right)
- `position_embedding_similarity(model)`  (Figure 7, centre)
- `patch_embedding_pcs(model, k=28)`  (Figure 7, left)
- `boundary_attention_share(model, images)`  (the mini experiment's claim about the demo model on dataset X)
- `token_norms(model, images)`  (Darcet et al. 2023: high-norm patch tokens, and the registers that take them)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import VitlabError, check_range
from vitlab.models.size import check_memory
from vitlab.models.vit import VisionTransformer
from vitlab.options import DEFAULT_FAST_PATH
from vitlab.speed.fastpath import FastPath, InferenceRunner

HEAD_FUSIONS = ("mean", "max", "min")
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of attention weights held per forward pass


# ----------------------------------------------------------------------------------------------------
# Helpers: which model, which layers, which images


def check_vit(model: nn.Module) -> None:
    """Attention maps, rollout, attention distance and Figure 7 need a ViT: a CNN has no attention."""
    if not isinstance(model, VisionTransformer):
        name = getattr(getattr(model, "pretrained_cfg", None), "architecture", None) or type(model).__name__
        raise VitlabError(
            f"{name} is a CNN baseline, which has no attention layers; attention maps and Figure 7 "
            "need a ViT (`vitlab info` lists the models)"
        )


def _layer_list(model: nn.Module, layers: int | str | Iterable[int] | None, arg: str = "layer") -> list[int]:
    """`None`/"all" -> every layer; an int (negative counts from the end) or a list -> those, sorted. `arg`:
    the argument's name in messages (layer, start_layer, end_layer)."""
    depth = len(model.blocks)
    if layers is None or layers == "all":
        return list(range(depth))
    if isinstance(layers, (int, str)):
        layers = [layers]
    out = []
    for layer in layers:
        try:
            i = int(layer)
        except (TypeError, ValueError):
            raise VitlabError(
                f"{arg} {layer!r} is not a layer index; expected an int in 0..{depth - 1} or 'all'", arg=arg
            ) from None
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise VitlabError(
                f"{arg} {i} does not exist: this model has layers 0..{depth - 1} (or -{depth}..-1)", arg=arg
            )
        out.append(j)
    return sorted(set(out))


def _batches(images, batch_size: int) -> Iterator[torch.Tensor]:
    """Image batches (b, C, H, W) from a tensor (B, C, H, W) or (C, H, W), or from an iterable of
    tensors or (image, label, ...) tuples (a DataLoader or a Dataset), at most `batch_size` each."""
    if isinstance(images, torch.Tensor):
        if images.ndim == 3:
            images = images[None]  # (1, C, H, W)
        if images.ndim != 4:
            raise VitlabError(f"images must be (B, C, H, W) or (C, H, W); found shape {tuple(images.shape)}")
        yield from images.split(batch_size)
        return
    pending: list[torch.Tensor] = []
    for item in images:
        x = item[0] if isinstance(item, (tuple, list)) else item
        if not isinstance(x, torch.Tensor):
            raise VitlabError(f"images must be tensors or (image, label) pairs; found {type(x).__name__}")
        if x.ndim == 4:
            yield from x.split(batch_size)
        elif x.ndim == 3:
            pending.append(x)
            if len(pending) == batch_size:
                yield torch.stack(pending)
                pending = []
        else:
            raise VitlabError(f"an image must be (C, H, W) or a batch (B, C, H, W); found shape {tuple(x.shape)}")
    if pending:
        yield torch.stack(pending)


@contextlib.contextmanager
def _eval_mode(model: nn.Module):
    """Eval mode (no dropout on the attention weights) and no autograd, restoring the mode after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _plan(model: nn.Module, layers: list[int], batch_size: int | None, max_bytes: int) -> tuple[int, list[list[int]]]:
    """How many images per forward pass and which layers together, so that the kept attention
    weights of one pass stay under `max_bytes` (at least one image and one layer per pass)."""
    T = model.cfg.num_patches + model.cfg.num_prefix_tokens
    per_layer_image = model.cfg.heads * T * T * 4  # bytes of one (h, T, T) float32 map
    # one image's maps of every layer asked for are kept, and one more is being computed
    check_memory(
        (len(layers) + 1) * per_layer_image,
        f"the attention weights of {len(layers)} layer(s) of one image "
        f"({model.cfg.heads} heads x {T:,} x {T:,} tokens each)",
        fix="; ask for fewer layers, or a smaller image size",
    )
    group = max(1, min(len(layers), max_bytes // per_layer_image))
    groups = [layers[i : i + group] for i in range(0, len(layers), group)]
    if batch_size is None:
        batch_size = max(1, max_bytes // (group * per_layer_image))
    else:
        check_range("batch_size", batch_size, low=1, integer=True)
    return int(batch_size), groups


def iter_attention(
    model: nn.Module,
    images,
    layers: int | str | Iterable[int] | None = "all",
    *,
    batch_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    out_device: str | torch.device | None = "cpu",
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> Iterator[dict[int, torch.Tensor]]:
    """Yield, per chunk of images, {layer: (b, h, T, T) float32 attention weights}.

    Runs the model in eval mode without gradients on the model's device, asking
    `forward_features(x, return_attention=group)` for one group of layers at a time (the other layers
    take the fast path). `batch_size=None` picks the chunk size from `max_bytes`. `fast_path`
    (a `vitlab.speed.fastpath.FastPath`, for images given as one (B, C, H, W) tensor): "auto" (the default)
    runs the passes on the plan the fixed rules give this machine and run (`vitlab.speed.rules`), a Plan on
    that plan, "off" or None the model as it is; the
    model itself is left as it is either way. `log` gets the path taken.
    """
    check_vit(model)
    layers = _layer_list(model, layers)
    batch_size, groups = _plan(model, layers, batch_size, max_bytes)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    count = images.shape[0] if isinstance(images, torch.Tensor) and images.ndim == 4 else None
    with _eval_mode(model):
        run = (
            InferenceRunner(
                model,
                precision="fp32",
                batch_size=batch_size,
                images=count * len(groups),
                device=device,
                fast=fast_path,
                method="forward_features",
                log=log,
            )
            if count
            else model.forward_features
        )
        for x in _batches(images, batch_size):
            x = x.to(device=device, dtype=dtype)
            chunk: dict[int, torch.Tensor] = {}
            for group in groups:
                _, attns = run(x, return_attention=group)  # list in layer order
                for layer, attn in zip(group, attns):
                    attn = attn.float()
                    chunk[layer] = attn.to(out_device) if out_device is not None else attn
            yield chunk
        if count and log is not None:
            log(f"fast path: {run.describe()}")


def attention_maps(
    model: nn.Module,
    images,
    layers: int | str | Iterable[int] | None = "all",
    *,
    batch_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    out_device: str | torch.device | None = "cpu",
) -> dict[int, torch.Tensor]:
    """The attention weights of the chosen layers: {layer: (B, h, T, T)}, rows summing to 1.

    `layers`: "all", an int (negative from the end) or a list. Each row is one query token's
    distribution over the keys; index 0 is the class token when the model has one. The model's default
    forward is untouched: a later `model(x)` still takes the fused path and gives the same logits.
    """
    out: dict[int, list[torch.Tensor]] = {}
    for chunk in iter_attention(
        model, images, layers, batch_size=batch_size, max_bytes=max_bytes, out_device=out_device
    ):
        for layer, attn in chunk.items():
            out.setdefault(layer, []).append(attn)
    return {layer: torch.cat(parts) for layer, parts in out.items()}


# ----------------------------------------------------------------------------------------------------
# From token-by-token matrices to maps on the patch grid


def token_map(
    matrix: torch.Tensor, *, num_prefix_tokens: int, grid_size: tuple[int, int], pool: str = "cls"
) -> torch.Tensor:
    """The row of a (..., T, T) attention (or rollout) matrix that the classifier reads, on the grid.

    `pool="cls"`: the class token's row over the patches, matrix[..., 0, prefix:]. `pool="mean"`
    (a GAP model, Appendix D.3): the average of the patch tokens' rows, since the head reads the mean
    of the patch tokens. Returns (..., gh, gw), rows = image rows, columns = image columns.
    """
    gh, gw = grid_size
    p = num_prefix_tokens
    if matrix.shape[-1] != gh * gw + p:
        raise VitlabError(f"attention has {matrix.shape[-1]} tokens, expected {gh}x{gw} patches + {p} prefix")
    if pool == "cls":
        if p == 0:
            raise VitlabError("pool='cls' needs a class token; this model has none (use pool='mean')")
        row = matrix[..., 0, p:]  # (..., N)
    else:
        row = matrix[..., p:, p:].mean(dim=-2)  # (..., N): average over the patch queries
    return row.reshape(*row.shape[:-1], gh, gw)  # (..., gh, gw), raster order


def _model_pool(model: nn.Module) -> str:
    """The row the classifier reads: the class token's (pool 'cls', and DINOv2's 'cls+mean'), or the patches' mean."""
    return "mean" if model.cfg.pool == "mean" else "cls"


def cls_attention(
    model: nn.Module,
    images,
    layers: int | str | Iterable[int] | None = -1,
    *,
    batch_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> dict[int, torch.Tensor]:
    """Per chosen layer, the attention of the token the head reads (the CLS row, or for a GAP model the
    mean over patch queries) to every patch: {layer: (B, h, gh, gw)}. Reduced chunk by chunk, so only
    (B, h, N) per layer is kept."""
    check_vit(model)
    cfg = model.cfg
    out: dict[int, list[torch.Tensor]] = {}
    for chunk in iter_attention(
        model, images, layers, batch_size=batch_size, max_bytes=max_bytes, fast_path=fast_path, log=log
    ):
        for layer, attn in chunk.items():
            m = token_map(
                attn, num_prefix_tokens=cfg.num_prefix_tokens, grid_size=cfg.grid_size, pool=_model_pool(model)
            )
            out.setdefault(layer, []).append(m)
    return {layer: torch.cat(parts) for layer, parts in out.items()}


# ----------------------------------------------------------------------------------------------------
# Attention rollout (Abnar & Zuidema 2020; the paper's Figure 6 and Appendix D.8)


def fuse_heads(attn: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """(B, h, T, T) -> (B, T, T): the mean, max or min over the heads."""
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    if head_fusion == "min":
        return attn.amin(dim=1)
    raise VitlabError(f"head fusion must be one of {', '.join(HEAD_FUSIONS)}; found {head_fusion!r}")


def _discard_lowest(a: torch.Tensor, ratio: float) -> torch.Tensor:
    """Zero the smallest `ratio` fraction of each row's weights (the diagonal is always kept).

    vit-explain discards over the whole matrix; per row keeps every query's own strongest links.
    """
    T = a.shape[-1]
    k = int(T * ratio)
    if k <= 0:
        return a
    eye = torch.eye(T, dtype=torch.bool, device=a.device)
    ranked = a.masked_fill(eye, float("inf"))  # the diagonal never ranks among the lowest
    idx = ranked.topk(k, dim=-1, largest=False).indices  # (B, T, k)
    return a.scatter(-1, idx, 0.0)


def attention_rollout(
    attentions: Sequence[torch.Tensor] | dict[int, torch.Tensor],
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    add_residual: bool = True,
) -> torch.Tensor:
    """Attention rollout: how much each token at the output draws on each input token, (B, T, T).

    For each layer l (from `start_layer`, an index into `attentions`, which are in layer order):
        A_l   = fuse_heads(attn_l)                    mean / max / min over heads
        A_l   = discard the lowest `discard_ratio` of each row (optional)
        A~_l  = (A_l + I) / rowsum(A_l + I)           the residual connection of Eq. 2, rows sum to 1
        R     = A~_l @ R                              R starts as the identity
    Rows are renormalised with keepdim, over the keys (the last axis): the common bug divides a
    (B, T, T) matrix by a (B, T) sum, which broadcasts along the wrong axis.
    """
    if isinstance(attentions, dict):
        attentions = [attentions[k] for k in sorted(attentions)]
    attentions = list(attentions)[start_layer:]
    if not attentions:
        raise VitlabError(f"attention rollout needs at least one layer at or after start_layer {start_layer}")
    check_range("discard_ratio", discard_ratio, low=0, high=1, high_open=True)
    B, _, T, _ = attentions[0].shape
    eye = torch.eye(T, dtype=attentions[0].dtype, device=attentions[0].device)
    result = eye.expand(B, T, T)
    for attn in attentions:
        a = fuse_heads(attn, head_fusion)  # (B, T, T)
        if discard_ratio > 0:
            a = _discard_lowest(a, discard_ratio)
        if add_residual:
            a = a + eye
        a = a / a.sum(dim=-1, keepdim=True)  # (B, T, T) / (B, T, 1): each row sums to 1
        result = a @ result  # later layers multiply on the left
    return result


def rollout(
    model: nn.Module,
    images,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int = -1,
    batch_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """The rollout map the classifier reads, (B, gh, gw): the CLS row of the rollout matrix over the
    patches, or for a GAP model the average over the patch tokens' rows. Layers `start_layer` ..
    `end_layer` (inclusive; negative counts from the end)."""
    check_vit(model)
    cfg = model.cfg
    start, end = _layer_list(model, start_layer, "start_layer")[0], _layer_list(model, end_layer, "end_layer")[0]
    if start > end:
        raise VitlabError(f"rollout start layer {start} is after its end layer {end}")
    maps = []
    for chunk in iter_attention(
        model, images, range(start, end + 1), batch_size=batch_size, max_bytes=max_bytes, fast_path=fast_path, log=log
    ):
        r = attention_rollout(chunk, head_fusion=head_fusion, discard_ratio=discard_ratio)  # (b, T, T)
        maps.append(
            token_map(r, num_prefix_tokens=cfg.num_prefix_tokens, grid_size=cfg.grid_size, pool=_model_pool(model))
        )
    return torch.cat(maps)


def explain(
    model: nn.Module,
    images,
    *,
    method: str = "cls",
    layers: int | str | Iterable[int] | None = -1,
    head: int | str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    batch_size: int | None = None,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> tuple[torch.Tensor, list[str], list[str]]:
    """The maps `vitlab attention` draws: (B, R, C, gh, gw) plus row and column labels.

    method "cls": the attention of the token the head reads to every patch in each chosen layer
    (rows = layers); `head` picks a head (int), fuses them ("mean", "max", "min": one column) or keeps
    them all ("all": one column per head). method "rollout": one map, rollout over layers
    `start_layer` .. the last of `layers`, heads fused by `head` (mean, max or min). `fast_path`, `log`:
    as `iter_attention`'s.
    """
    check_vit(model)
    chosen = _layer_list(model, layers)
    if method == "rollout":
        if head not in HEAD_FUSIONS:
            raise VitlabError(
                f"head {head!r}: rollout fuses the heads of every layer; use mean, max or min", arg="head"
            )
        m = rollout(
            model,
            images,
            head_fusion=str(head),
            discard_ratio=discard_ratio,
            start_layer=start_layer,
            end_layer=chosen[-1],
            batch_size=batch_size,
            fast_path=fast_path,
            log=log,
        )  # (B, gh, gw)
        start = _layer_list(model, start_layer, "start_layer")[0]
        return m[:, None, None], [f"rollout {start}-{chosen[-1]}"], [f"{head} of heads"]
    if method != "cls":
        raise VitlabError(f"method must be cls or rollout; found {method!r}", arg="method")
    per_layer = cls_attention(
        model, images, chosen, batch_size=batch_size, fast_path=fast_path, log=log
    )  # {layer: (B, h, gh, gw)}
    maps = torch.stack([per_layer[layer] for layer in chosen], dim=1)  # (B, L, h, gh, gw)
    rows = [f"layer {layer}" for layer in chosen]
    if head == "all":
        return maps, rows, [f"head {i}" for i in range(maps.shape[2])]
    if head in HEAD_FUSIONS:
        return (
            fuse_heads(maps.flatten(0, 1), str(head)).unflatten(0, maps.shape[:2])[:, :, None],
            rows,
            [f"{head} of heads"],
        )
    try:
        h = int(head)
    except (TypeError, ValueError):
        raise VitlabError(f"head {head!r}: expected a head index, mean, max, min or all", arg="head") from None
    if not 0 <= h < maps.shape[2]:
        raise VitlabError(f"head {h} does not exist: this model has heads 0..{maps.shape[2] - 1}", arg="head")
    return maps[:, :, h : h + 1], rows, [f"head {h}"]


# ----------------------------------------------------------------------------------------------------
# Mean attention distance (Figure 7, right)


def patch_distances(grid_size: tuple[int, int], patch_size: int) -> torch.Tensor:
    """(N, N) Euclidean distances in pixels between patch centres, patches in raster order."""
    gh, gw = grid_size
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], dim=1) * patch_size  # (N, 2) in pixels
    return torch.cdist(centres, centres).float()  # (N, N)


def attention_distance(
    attn: torch.Tensor, *, num_prefix_tokens: int, grid_size: tuple[int, int], patch_size: int
) -> torch.Tensor:
    """Mean attention distance per image and head, in pixels: (B, h, T, T) -> (B, h).

    For each query patch q: sum_k a[q, k] d(q, k) over the key patches k, with the weights of the
    query's row restricted to the patches and renormalised (the prefix tokens have no position);
    then the mean over the query patches. Uniform attention gives the grid's mean pairwise distance.
    """
    p = num_prefix_tokens
    a = attn[..., p:, p:]  # (B, h, N, N): patch queries to patch keys
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)  # rows over the patch keys sum to 1
    d = patch_distances(grid_size, patch_size).to(a)  # (N, N)
    return (a * d).sum(dim=-1).mean(dim=-1)  # (B, h)


def mean_attention_distance(
    model: nn.Module,
    images,
    layers: int | str | Iterable[int] | None = "all",
    *,
    batch_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> tuple[list[int], torch.Tensor]:
    """Figure 7 (right): per layer and head, the attention-weighted distance in pixels between query
    and key patches, averaged over the images. Returns (layers, distances (len(layers), h))."""
    check_vit(model)
    cfg = model.cfg
    total: dict[int, torch.Tensor] = {}
    n = 0
    for chunk in iter_attention(
        model, images, layers, batch_size=batch_size, max_bytes=max_bytes, fast_path=fast_path, log=log
    ):
        for layer, attn in chunk.items():
            d = attention_distance(
                attn, num_prefix_tokens=cfg.num_prefix_tokens, grid_size=cfg.grid_size, patch_size=cfg.patch_size
            )  # (b, h)
            total[layer] = total.get(layer, 0) + d.double().sum(dim=0)
        n += next(iter(chunk.values())).shape[0]
    if n == 0:
        raise VitlabError("mean attention distance needs at least one image; found none")
    chosen = sorted(total)
    return chosen, torch.stack([total[layer] / n for layer in chosen]).float()


# ----------------------------------------------------------------------------------------------------
# Position-embedding similarity (Figure 7, centre) and patch-embedding filters (Figure 7, left)


def patch_position_embedding(model: nn.Module) -> torch.Tensor:
    """The position embedding of the N patches, (N, D), raster order; the prefix tokens' rows dropped."""
    check_vit(model)
    cfg = model.cfg
    if cfg.pos_embed in ("learned", "learned2d", "sincos2d"):
        return model.patch_pos_embed()[0].detach()  # (N, D)
    raise VitlabError(
        f"the model's pos_embed is {cfg.pos_embed!r}, which has no table of absolute position embeddings; "
        "position-embedding similarity needs pos_embed learned, learned2d or sincos2d"
    )


def position_embedding_similarity(model: nn.Module) -> torch.Tensor:
    """Figure 7 (centre): cosine similarity of every patch's position embedding with every other's,
    (N, N); row i reshaped to (gh, gw) is the tile of position i."""
    pe = patch_position_embedding(model).float()  # (N, D)
    pe = F.normalize(pe, dim=-1)
    return pe @ pe.T  # (N, N)


def patch_embedding_pcs(model: nn.Module, k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Figure 7 (left): the first `k` principal components of the patch-embedding filters E.

    E's D rows are each a C x P x P filter (Conv2d weight (D, C, P, P), or the Linear weight (D, C*P*P)
    in the same (C, P, P) order). PCA over the D filters: centre them, SVD, keep the top right singular
    vectors. Returns (components (k, C, P, P), explained variance ratio (k,)). A component's sign is
    arbitrary (PCA fixes only the direction).
    """
    check_vit(model)
    cfg = model.cfg
    if cfg.stem == "hybrid":
        raise VitlabError(
            "the hybrid stem's projection is a 1x1 conv over CNN features, not RGB patch filters; "
            "patch-embedding PCA needs stem='patch'"
        )
    P, C = cfg.patch_size, cfg.in_chans
    w = model.patch_embed.proj.weight.detach().float().reshape(cfg.dim, C * P * P)  # (D, C*P*P)
    w = w - w.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(w, full_matrices=False)  # vh: (min(D, CPP), CPP)
    k = min(k, vh.shape[0])
    var = s**2
    ratio = var[:k] / var.sum().clamp_min(1e-12)
    return vh[:k].reshape(k, C, P, P), ratio  # (k, C, P, P), (k,)


# ----------------------------------------------------------------------------------------------------
# The mini experiment's claim: does the demo model's CLS token look at the boundary between the halves?


@dataclass(frozen=True)
class BoundaryShare:
    """The share of last-layer CLS->patch attention on the boundary columns, and the uniform share."""

    share: float  # attention on the boundary columns / attention on all patches, mean over heads and images
    uniform: float  # the same share for uniform attention: len(columns) / gw
    columns: tuple[int, ...]  # the patch-grid columns next to the vertical boundary
    layer: int
    n_images: int

    @property
    def ratio(self) -> float:
        return self.share / self.uniform

    def to_dict(self) -> dict:
        return {**asdict(self), "columns": list(self.columns), "ratio": self.ratio}

    def __str__(self) -> str:
        cols = ", ".join(map(str, self.columns))
        return (
            f"last-layer CLS attention on the boundary columns ({cols}): {self.share:.3f} "
            f"vs {self.uniform:.3f} for uniform attention ({self.ratio:.2f}x), over {self.n_images} images"
        )


def boundary_columns(img_width: int, patch_size: int) -> tuple[int, ...]:
    """The patch columns that touch the vertical line x = W/2: two when it falls between patches
    (32 px, patch 4: columns 3 and 4 of 8), one when it cuts through a patch."""
    half = img_width / 2
    if half % patch_size == 0:
        c = int(half // patch_size)
        return (c - 1, c)
    return (int(half // patch_size),)


def boundary_attention_share(
    model: nn.Module, images, *, columns: Sequence[int] | None = None, batch_size: int | None = 256
) -> BoundaryShare:
    """The mini experiment claims the trained demo model's CLS token attends to what separates the
    classes; on dataset X that is the vertical boundary between the bright and the dark half. This
    measures it.

    The last layer's CLS->patch attention (for a model without class token, the mean of the patch
    rows) is renormalised over the patches, averaged over heads and images, and summed over the
    boundary `columns` (default: `boundary_columns`). Uniform attention would give len(columns)/gw.

    images: a tensor (B, C, H, W), or an iterable of tensors or (image, label) batches.
    Returns a `BoundaryShare` (share, uniform, columns, layer, n_images; `.ratio`, `.to_dict()`).
    """
    check_vit(model)
    cfg = model.cfg
    gh, gw = cfg.grid_size
    columns = tuple(
        int(c) for c in (columns if columns is not None else boundary_columns(cfg.img_size[1], cfg.patch_size))
    )
    if not columns or any(not 0 <= c < gw for c in columns):
        raise VitlabError(f"boundary columns {columns} must lie in 0..{gw - 1} (the patch grid is {gh}x{gw})")
    last = len(model.blocks) - 1
    total, n = 0.0, 0
    for chunk in iter_attention(model, images, [last], batch_size=batch_size):
        m = token_map(
            chunk[last], num_prefix_tokens=cfg.num_prefix_tokens, grid_size=cfg.grid_size, pool=_model_pool(model)
        )
        m = m.mean(dim=1)  # (b, gh, gw): mean over heads
        m = m / m.sum(dim=(-2, -1), keepdim=True)  # share of the patch attention, per image
        total += m[:, :, list(columns)].sum().item()
        n += m.shape[0]
    if n == 0:
        raise VitlabError("boundary_attention_share needs at least one image; found none")
    return BoundaryShare(share=total / n, uniform=len(columns) / gw, columns=columns, layer=last, n_images=n)


# ----------------------------------------------------------------------------------------------------
# Token norms (Darcet et al. 2023, "Vision Transformers Need Registers", Section 2)


def prefix_token_names(cfg) -> list[str]:
    """Short names of the prefix tokens, in token order: cls, dist, reg0, reg1, ..."""
    names = ["cls"] if cfg.class_token else []
    if cfg.dist_token:
        names.append("dist")
    return names + [f"reg{i}" for i in range(cfg.reg_tokens)]


@dataclass(frozen=True)
class TokenNorms:
    """The L2 norm of every token of z_l, the residual stream after block l (before the final LayerNorm).

    Darcet et al. found that large ViTs trained long (DINOv2, OpenCLIP, DeiT III) turn a few patch tokens
    of background into stores of global information: their norm is ~10x the others', and their attention
    maps show them as artefacts. Given register tokens, the model keeps that information there instead.
    """

    layers: tuple[int, ...]
    patches: torch.Tensor  # (L, B, gh, gw): each patch token's norm, on the patch grid
    prefix: torch.Tensor  # (L, B, p): each prefix token's norm, in token order
    prefix_names: tuple[str, ...]  # cls, dist, reg0, ...

    def high_norm(self, ratio: float = 4.0) -> torch.Tensor:
        """(L, B, gh, gw) bools: patches whose norm exceeds `ratio` times the median patch norm of their
        image and layer. Darcet et al. split a bimodal histogram (at 150 for DINOv2 ViT-g); a ratio to
        the median works at any width and depth."""
        median = self.patches.flatten(2).median(dim=-1).values  # (L, B)
        return self.patches > ratio * median[..., None, None]

    def summary(self, ratio: float = 4.0) -> list[dict]:
        """Per layer, over all images: the patches' median, 95th percentile and max norm, the share of
        high-norm patches, and each prefix token's mean norm."""
        high = self.high_norm(ratio)
        rows = []
        for i, layer in enumerate(self.layers):
            flat = self.patches[i].flatten()
            row = {
                "layer": layer,
                "patch_median": float(flat.median()),
                "patch_p95": float(flat.quantile(0.95)),
                "patch_max": float(flat.max()),
                "high_norm_share": float(high[i].float().mean()),
            }
            row.update({name: float(self.prefix[i, :, j].mean()) for j, name in enumerate(self.prefix_names)})
            rows.append(row)
        return rows


def token_norms(
    model: nn.Module, images, layers: int | str | Iterable[int] | None = "all", *, batch_size: int | None = 32
) -> TokenNorms:
    """The norm of every token after each chosen block, patches on the grid and prefix tokens apart.

    Hooks on the blocks read their outputs during one ordinary forward pass (the fast attention path;
    the hooks are removed afterwards), in eval mode without gradients.
    """
    check_vit(model)
    cfg = model.cfg
    chosen = _layer_list(model, layers)
    gh, gw = cfg.grid_size
    p = cfg.num_prefix_tokens
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    per_chunk: list[torch.Tensor] = []
    caught: dict[int, torch.Tensor] = {}

    def keep(i: int):
        def hook(module, args, out):  # a Block returns (tokens, attention weights or None)
            caught[i] = out[0].detach().float().norm(dim=-1).cpu()  # (b, T)

        return hook

    hooks = [model.blocks[i].register_forward_hook(keep(i)) for i in chosen]
    try:
        with _eval_mode(model):
            for x in _batches(images, batch_size or 32):
                model.forward_features(x.to(device=device, dtype=dtype))
                per_chunk.append(torch.stack([caught[i] for i in chosen]))  # (L, b, T)
    finally:
        for hook in hooks:
            hook.remove()
    if not per_chunk:
        raise VitlabError("token_norms needs at least one image; found none")
    norms = torch.cat(per_chunk, dim=1)  # (L, B, T)
    patches = norms[..., p:].reshape(len(chosen), -1, gh, gw)  # (L, B, gh, gw), raster order
    return TokenNorms(
        layers=tuple(chosen), patches=patches, prefix=norms[..., :p], prefix_names=tuple(prefix_token_names(cfg))
    )


__all__ = [
    "check_vit",
    "HEAD_FUSIONS",
    "iter_attention",
    "attention_maps",
    "token_map",
    "cls_attention",
    "fuse_heads",
    "attention_rollout",
    "rollout",
    "explain",
    "patch_distances",
    "attention_distance",
    "mean_attention_distance",
    "patch_position_embedding",
    "position_embedding_similarity",
    "patch_embedding_pcs",
    "BoundaryShare",
    "boundary_columns",
    "boundary_attention_share",
    "prefix_token_names",
    "TokenNorms",
    "token_norms",
]
