"""Top-k predictions for image files, with the preprocessing of the weights' source.

    model = vitlab.create_model(
        "vit_base_patch16_224", pretrained="hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    )
    results = predict_files(model, ["cat.jpg"], topk=5)

One bad file does not stop the others: its result carries an `error` (a one-line message naming the
file) instead of `predictions`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitlab.data.preprocess import eval_transform, load_images
from vitlab.errors import VitlabError, check_range
from vitlab.inference.engine import check_engine, inference_engine
from vitlab.models.size import check_fits
from vitlab.options import DEFAULT_ENGINE, DEFAULT_FAST_PATH, check_precision
from vitlab.runtime import autocast, resolve_device
from vitlab.speed.fastpath import FastPath


def class_names(model: nn.Module) -> list[str] | None:
    names = model.pretrained_cfg.label_names
    return list(names) if names else None


@torch.no_grad()
def predict_tensors(
    model: nn.Module,
    images: torch.Tensor,
    *,
    topk: int = 5,
    device: torch.device | None = None,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 3, H, W) preprocessed images -> (probabilities (B, k), class indices (B, k)), best first.
    `model`: the model, or anything called like it (an `Engine` of `vitlab.inference.engine`, with `device`)."""
    device = device or next(model.parameters()).device
    with autocast(device, precision):
        logits = model(images.to(device))  # (B, num_classes)
    probs = logits.float().softmax(dim=-1)  # softmax in fp32 even under bf16 autocast
    k = min(topk, probs.shape[-1])
    top = probs.topk(k, dim=-1)
    return top.values.cpu(), top.indices.cpu()


def finite_rows(values: torch.Tensor) -> list[bool]:
    """Which rows hold only finite numbers: a NaN or an infinity is no probability, never a result."""
    return torch.isfinite(values).all(dim=-1).tolist()


def check_options(
    *,
    topk: int = 5,
    batch_size: int = 16,
    device: str | torch.device | None = "auto",
    precision: str = "fp32",
    engine: str = DEFAULT_ENGINE,
) -> torch.device:
    """predict_files' options, checkable before the model is loaded. Returns the device."""
    check_range("topk", topk, low=1, integer=True)
    check_range("batch_size", batch_size, low=1, integer=True)
    check_precision(precision)
    check_engine(engine)
    return resolve_device(device)


def predict_files(
    model: nn.Module,
    paths,
    *,
    topk: int = 5,
    device: str | torch.device | None = "auto",
    precision: str = "fp32",
    batch_size: int = 16,
    img_size: int | tuple[int, int] | None = None,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    engine: str = DEFAULT_ENGINE,
    prepared: Callable | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Predict every file in `paths`, in order. Each result is
    {"file": path, "predictions": [{"rank", "index", "label", "prob"}, ...]} or {"file": path, "error": message}.

    The model's `pretrained_cfg` decides the preprocessing (resize, crop, interpolation, mean, std).
    `fast_path` (a `vitlab.speed.fastpath.FastPath`): "auto" (the default) runs the batches on the plan the
    fixed rules give this machine and run (oneDNN's products on AMD, torch.compile for a long run on an Intel
    Xeon with AMX; the same logits to ~1e-5), a Plan on that plan, "off" or None the model as it is; `model`
    itself is left as it is either way.
    `engine` (`vitlab.inference.engine`): "auto" (the default) the engine the fixed rules give this machine,
    precision and batch (ONNX Runtime for fp32 at batch 1 on an AMD Zen 4; PyTorch elsewhere), "torch", or
    "onnxruntime" (the model exported to ONNX once per weights, checked against PyTorch; the same top-k, the
    probabilities to ~1e-6). Where ONNX Runtime cannot run, PyTorch does, and the engine's line says why.
    `prepared`: what computes the logits, readied already (`vitlab serve`'s, from `engine.serving_engine`),
    whatever `fast_path` and `engine` say. `log` gets a line saying the engine taken (`engine: ...`) and, on
    PyTorch, one saying its path (`fast path: ...`).
    """
    dev = check_options(topk=topk, batch_size=batch_size, device=device, precision=precision, engine=engine)
    pcfg = model.pretrained_cfg
    check_fits(model.cfg, what=pcfg.architecture or "the model", batch_size=max(1, min(batch_size, len(paths))))
    head = model.head
    if isinstance(head, nn.Identity):  # num_classes=0: DINO/DINOv2 and other self-supervised backbones
        raise VitlabError(
            f"the weights {pcfg.source!r} have no classifier: the model returns features, not class scores (a "
            "DINO/DINOv2-style backbone); `vitlab attention` and `vitlab inspect` show inside it, and `vitlab "
            "finetune` trains a classifier on it"
        )
    if isinstance(head, nn.Linear) and not head.weight.detach().any():  # zeroed (in21k), absent or new head
        raise VitlabError(
            f"the weights {pcfg.source!r} have no trained classifier (the head is all zeros: an "
            "ImageNet-21k pre-training checkpoint, a backbone, or a new head), so predictions would be "
            "meaningless; use weights fine-tuned for classification (e.g. an ..._in1k checkpoint) or fine-tune first"
        )
    model = model.to(dev).eval()
    paths = [str(p) for p in paths]
    runner = prepared or inference_engine(
        model,
        engine=engine,
        precision=precision,
        batch_size=batch_size,
        images=len(paths),
        device=dev,
        fast=fast_path,
        log=log,
    )
    transform = eval_transform(pcfg, img_size or model.cfg.img_size)
    names = class_names(model)
    results: dict[str, dict] = {}
    for start in range(0, len(paths), batch_size):
        chunk = paths[start : start + batch_size]
        good, bad = load_images(chunk, transform)
        for path, message in bad:
            results[path] = {"file": path, "error": message}
        if not good:
            continue
        batch = torch.stack([t for _, t in good])  # (B, 3, H, W)
        probs, indices = predict_tensors(runner, batch, topk=topk, device=dev, precision=precision)
        for (path, _), p_row, i_row, finite in zip(good, probs.tolist(), indices.tolist(), finite_rows(probs)):
            if not finite:
                results[path] = {
                    "file": path,
                    "error": f"{path}: the model's scores for this image are not finite "
                    f"(NaN or infinity): its weights ({pcfg.source}) overflow at {precision}; nothing to "
                    "report",
                }
                continue
            results[path] = {
                "file": path,
                "predictions": [
                    {"rank": r + 1, "index": i, "label": names[i] if names and i < len(names) else str(i), "prob": p}
                    for r, (p, i) in enumerate(zip(p_row, i_row))
                ],
            }
    if log is not None and prepared is None:
        for line in runner.lines():
            log(line)
    return [results[p] for p in paths]


def format_results(results: list[dict]) -> str:
    """Human-readable top-k lists, one block per image."""
    lines = []
    for r in results:
        if "error" in r:
            continue  # errors go to stderr, one line each
        lines.append(r["file"])
        for p in r["predictions"]:
            lines.append(f"  {p['rank']}. {p['prob']:7.2%}  {p['label']}  (class {p['index']})")
    return "\n".join(lines)


__all__ = ["check_options", "predict_files", "predict_tensors", "format_results", "class_names"]
