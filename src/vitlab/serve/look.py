"""What the page computes for an image, as plain functions: the top-k (`vitlab predict`'s), the
attention overlays (`vitlab attention`'s), Figure 7 and the token-norm map (`vitlab inspect`'s).

Each one goes through the same library code as its command, with the same arguments, so the page and
the command line show the same numbers for the same image: `predict_files` (the weights' own
preprocessing, the softmax in fp32), `explain` + `plots.final_overlay` (the picture `vitlab attention`
writes as <stem>_<method>_overlay.png), `plots.write_figure7`, `plots.write_token_norms`. The page
computes the top-k with the model's readied copy once it is ready (`LoadedModel.for_topk`: the engine
and plan of `vitlab.inference.engine.serving_engine`, ONNX Runtime or PyTorch), as `vitlab predict` does,
which moves a probability by ~1e-6 at most; the attention maps, Figure 7 and the token norms
use the model as built, which they need as it is.

Files are named by their base name in messages (an upload lives under a temporary folder, but the
user knows it by its name).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vitlab.analysis import attention as A
from vitlab.analysis import plots
from vitlab.data.preprocess import images_tensor
from vitlab.errors import VitlabError, check_range
from vitlab.inference.predict import predict_files
from vitlab.serve.models import LoadedModel

METHODS = ("cls", "rollout")
UPSAMPLING = ("bilinear", "nearest")
NORM_RATIO = 4.0  # `vitlab inspect --norm-ratio`'s default: a patch norm above R x its layer's median is marked


def _named(message: str, path: str | Path) -> str:
    """A message about an uploaded file, naming the file as the user knows it (its base name)."""
    return message.replace(str(path), Path(path).name)


# ----------------------------------------------------------------------------------------------------
# Top-k


def predict(loaded: LoadedModel, paths: list[str | Path], *, topk: int = 5) -> list[dict]:
    """`vitlab predict`'s results for each file, in order: {"file": name, "predictions": [{"rank",
    "index", "label", "prob"}, ...]} or {"file": name, "error": message}. A model without a trained
    head is a VitlabError (predictions would be meaningless)."""
    results = predict_files(
        loaded.model,
        paths,
        topk=topk,
        device=loaded.device,
        precision=loaded.precision,
        batch_size=16,
        prepared=loaded.for_topk(),
    )
    for r, path in zip(results, paths):
        r["file"] = Path(path).name
        if "error" in r:
            r["error"] = _named(r["error"], path)
    return results


def format_prob(p: float) -> str:
    """A probability as `vitlab predict` prints it: 93.41%."""
    return f"{p:.2%}"


def topk_html(result: dict) -> str:
    """One image's top-k as HTML bars (widths = probabilities), labels escaped; or its error."""
    if "error" in result:
        return error_html(result["error"])
    rows = []
    for p in result["predictions"]:
        rows.append(
            '<div class="vl-row">'
            f'<div class="vl-label">{p["rank"]}. {html.escape(p["label"])} '
            f'<span class="vl-class">(class {p["index"]})</span></div>'
            f'<div class="vl-bar"><div class="vl-fill" style="width:{100 * p["prob"]:.2f}%"></div></div>'
            f'<div class="vl-prob">{format_prob(p["prob"])}</div></div>'
        )
    return f'<div class="vl-topk" data-file="{html.escape(result["file"])}">{"".join(rows)}</div>'


def error_html(message: str) -> str:
    return f'<div class="vl-error">error: {html.escape(message)}</div>'


def summary_rows(results: list[dict]) -> list[list[str]]:
    """One table row per image: file, the top-1 probability, the top-1 class (or the error)."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["file"], "", "error: " + r["error"]])
        else:
            best = r["predictions"][0]
            rows.append([r["file"], format_prob(best["prob"]), best["label"]])
    return rows


# ----------------------------------------------------------------------------------------------------
# Attention


@dataclass(frozen=True)
class Overlay:
    picture: np.ndarray  # (H, W, 3) uint8, the image with the heatmap blended on it
    caption: str


def attention_overlay(
    loaded: LoadedModel,
    path: str | Path,
    *,
    method: str = "cls",
    layer: int | str = "last",
    head: int | str = "mean",
    alpha: float = 0.5,
    upsample: str = "bilinear",
    start_layer: int = 0,
    discard_ratio: float = 0.0,
) -> Overlay:
    """The overlay `vitlab attention IMAGE --method M --layer L --head H --alpha A --upsample U` writes
    as <stem>_<method>_overlay.png, for one image file, with a caption saying where the map peaks."""
    check_range("alpha", alpha, low=0, high=1)
    check_range("discard_ratio", discard_ratio, low=0, high=1, high_open=True)
    if upsample not in UPSAMPLING:
        raise VitlabError(f"upsample must be one of {', '.join(UPSAMPLING)}; found {upsample!r}", arg="upsample")
    model = loaded.model
    try:
        x = images_tensor([path], model.pretrained_cfg, model.cfg.img_size)  # (1, C, H, W)
    except VitlabError as e:
        raise VitlabError(_named(str(e), path)) from e
    layers = {"last": -1, "all": "all"}.get(str(layer), layer)
    maps, rows, cols = A.explain(
        model,
        x,
        method=method,
        layers=layers,
        head=head,
        discard_ratio=discard_ratio,
        start_layer=start_layer,
        fast_path=None,  # the model as built: a faster copy for one image would cost more than it saves
    )  # (1, R, C, gh, gw)
    picture, final = plots.final_overlay(
        plots.display_image(x[0], model.pretrained_cfg), maps[0], alpha=alpha, mode=upsample
    )
    gh, gw = model.cfg.grid_size
    peak = int(final.argmax())
    what = cols[-1] if len(cols) == 1 else "mean of heads"
    caption = (
        f"{rows[-1]}, {what}: peak at patch (row {peak // gw}, col {peak % gw}) of {gh}x{gw}, "
        f"weight {float(final.max()):.3f}"
    )
    return Overlay(picture, caption)


# ----------------------------------------------------------------------------------------------------
# Figure 7


def figure7(loaded: LoadedModel, images: list[Image.Image | str | Path], out_dir: str | Path) -> dict:
    """`vitlab inspect`'s Figure 7 of the model over `images`, written to `out_dir`: the summary of
    `plots.write_figure7` (files, headline numbers, notes) plus "lines", the text `vitlab inspect` prints."""
    model = loaded.model
    x = images_tensor(images, model.pretrained_cfg, model.cfg.img_size)
    summary = plots.write_figure7(model, x, out_dir, fast_path=None)  # the model as built, as the page's maps
    summary["lines"] = plots.figure7_lines(summary)
    summary["n_images"] = len(x)
    return summary


# ----------------------------------------------------------------------------------------------------
# Token norms (Darcet et al. 2023)


def token_norms(
    loaded: LoadedModel, images: list[Image.Image | str | Path], out_dir: str | Path, *, ratio: float = NORM_RATIO
) -> dict:
    """`vitlab inspect --norm-ratio R`'s token-norm map of the model over `images`, written to `out_dir`
    (token_norms.png of the first image, token_norms.csv over all): the summary of
    `plots.write_token_norms` plus "lines", the text `vitlab inspect` prints, and "n_images"."""
    model = loaded.model
    x = images_tensor(images, model.pretrained_cfg, model.cfg.img_size)
    display = plots.display_image(x[0], model.pretrained_cfg)  # the first image, as `vitlab inspect` shows it
    summary = plots.write_token_norms(model, x, display, out_dir, ratio=ratio)
    summary["lines"] = plots.token_norm_lines(summary)
    summary["n_images"] = len(x)
    return summary


def token_norm_markdown(summary: dict) -> str:
    """What the token-norm map shows, in a sentence, then `vitlab inspect`'s lines about it."""
    explain = (
        f"**Token norms** (Darcet et al. 2023, *Vision Transformers Need Registers*): the norm of every "
        f"token after each block, on the patch grid for the first image, the prefix tokens (class, "
        f"distillation, registers) beside it; patches above {summary['ratio']:g} x their layer's median "
        f"are outlined in red. Large ViTs trained long store global information in a few background "
        f"patches, which stand out here."
    )
    return explain + "\n\n" + "\n".join(f"- {line.strip()}" for line in summary["lines"])


__all__ = [
    "METHODS",
    "UPSAMPLING",
    "NORM_RATIO",
    "predict",
    "format_prob",
    "topk_html",
    "error_html",
    "summary_rows",
    "Overlay",
    "attention_overlay",
    "figure7",
    "token_norms",
    "token_norm_markdown",
]
