"""Export a model: safetensors weights (+ a JSON config vitlab reloads), or ONNX checked against PyTorch.

    export_model(model, "vit.safetensors")   # vit.safetensors + vit.json; the weights keep timm's names,
                                             # so timm's VisionTransformer.load_state_dict takes them as they are
    export_model(model, "vit.onnx")          # input "image" (B, 3, H, W) with a dynamic batch axis, output
                                             # "logits" (B, K); checked with onnxruntime (max abs diff <= 1e-4)
    export_model(model, "vit-timm", format="timm")  # a timm hub folder; format="hf": a save_pretrained
                                             # folder (vitlab.inference.interop), each checked with its library

Nothing half-written is ever left: files are written in a temporary folder next to the target and
moved into place only when complete (and, for ONNX, only when the check passed).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from vitlab.errors import VitlabError, check_range
from vitlab.fileio import (
    FILE_MODE,
    check_out_file,
    check_out_folder,
    created_folders,
    import_onnxruntime,
    remove_leftovers,
    tmp_prefix,
    umask,
    write_error,
    write_json,
)
from vitlab.inference import interop
from vitlab.weights.checkpoint import model_meta

ONNX_TOLERANCE = 1e-4  # max abs difference of the logits, ONNX Runtime vs PyTorch (fp32)
SUFFIXES = (".safetensors", ".onnx")
MIN_OPSET = 17  # the first opset with LayerNormalization; torch's exporter writes 18 and converts to others


def check_export(out: str | Path, *, opset: int | None = None, force: bool = False, format: str | None = None) -> Path:
    """The export's options, checked before any work: the format (`format`, else from the suffix), the
    opset, and the place (vitlab.fileio.check_out_file: an existing file, or its .json, is replaced only
    with `force`; a folder format's folder must be new, empty or an earlier export of that format)."""
    out = Path(out).expanduser()
    if format is not None:
        if format not in interop.FORMATS:
            raise VitlabError(f"format must be one of {', '.join(interop.FORMATS)}; found {format!r}", arg="format")
        return check_out_folder(out, kind=f"export-{format}", arg="out")
    if out.suffix.lower() not in SUFFIXES:
        raise VitlabError(
            f"out {out}: unknown export format {out.suffix!r}; expected a path ending in {' or '.join(SUFFIXES)}",
            arg="out",
        )
    check_range("opset", opset, low=MIN_OPSET, integer=True, optional=True)
    companions = [out.with_suffix(".json")] if out.suffix.lower() == ".safetensors" else []
    return check_out_file(out, force=force, companions=companions)


def export_model(
    model: nn.Module,
    out: str | Path,
    *,
    check: bool = True,
    opset: int | None = None,
    force: bool = False,
    format: str | None = None,
) -> dict:
    """Write `model` to `out` (format from the suffix, or `format` "timm" / "hf": a folder). Returns a
    report: the files written and, for ONNX, timm and hf, the max abs difference measured by the other
    runtime. An existing file is replaced only with `force`."""
    out = check_export(out, opset=opset, force=force, format=format)
    if format is not None:
        return interop.export_folder(model, out, format=format, check=check)
    model = copy.deepcopy(model).eval().float().cpu()  # the caller's model stays as it is
    with created_folders(out.parent):
        if out.suffix.lower() == ".safetensors":
            return export_safetensors(model, out)
        return export_onnx(model, out, check=check, opset=opset)


@contextmanager
def _staging(out: Path):
    """A temporary folder next to `out`; its files are moved into place only if the block succeeds."""
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=tmp_prefix(out)))
    try:
        try:
            yield tmp
        except (OSError, SafetensorError) as e:  # a full disk: one line, nothing left behind
            raise write_error(out, e) from e
        for f in sorted(tmp.iterdir()):
            f.chmod(FILE_MODE & ~umask())  # temp files may be private (0600); the exported files are ordinary ones
            os.replace(f, out.parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    remove_leftovers(out)


@contextmanager
def _quiet(logger: str):
    """Drop a library logger's warnings for the block (its level restored after)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def export_config(model: nn.Module) -> dict:
    """The JSON written next to the weights: vitlab's checkpoint config ({"kind": "vit", "config",
    "pretrained_cfg"}, as vitlab.weights.checkpoint writes it) plus timm's top-level fields."""
    meta = model_meta(model)
    pcfg = meta["pretrained_cfg"]
    if isinstance(model.head, nn.Linear):
        pcfg["head"] = "loaded" if model.head.weight.detach().any() else "zero"
    pcfg["notes"] = []  # the notes described the original load, not this file
    meta.update(architecture=pcfg.get("architecture"), num_classes=model.cfg.num_classes)
    return meta


def export_safetensors(model: nn.Module, out: Path) -> dict:
    """`out` (the state dict, timm names) and `out.with_suffix('.json')` (export_config)."""
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    config_path = out.with_suffix(".json")
    with _staging(out) as tmp:
        save_file(tensors, str(tmp / out.name), metadata={"format": "pt", "producer": "vitlab"})
        write_json(tmp / config_path.name, export_config(model))
    return {"files": [str(out), str(config_path)], "tensors": len(tensors)}


def export_onnx(model: nn.Module, out: Path, *, check: bool = True, opset: int | None = None) -> dict:
    """ONNX with a dynamic batch axis, checked with ONNX Runtime on a batch size other than the one traced."""
    C, H, W = model.cfg.in_chans, *model.cfg.img_size
    example = torch.randn(2, C, H, W, generator=torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=1024)
    big = sum(p.numel() * p.element_size() for p in model.parameters()) > 1.8 * 2**30  # ONNX's 2 GB protobuf limit
    report = {"files": [str(out)]}
    with _staging(out) as tmp:
        try:
            with _quiet("onnxscript.version_converter"):  # its opset warnings are reported below, in one line
                program = torch.onnx.export(
                    model,
                    (example,),
                    dynamo=True,
                    input_names=["image"],
                    output_names=["logits"],
                    dynamic_shapes=({0: batch},),
                    opset_version=opset,
                    report=False,
                    verbose=False,
                )
        except Exception as e:  # the exporter's errors are many and unrelated
            raise VitlabError(f"ONNX export to {out} failed: {type(e).__name__}: {str(e).splitlines()[0]}") from e
        written = next((o.version for o in program.model_proto.opset_import if o.domain == ""), None)
        if opset is not None and written != opset:  # the exporter falls back to its own opset with a warning
            raise VitlabError(
                f"opset {opset}: torch's ONNX exporter cannot convert this model to that opset (it fell "
                f"back to opset {written}); choose a lower one ({MIN_OPSET} or more), or leave opset out",
                arg="opset",
            )
        program.save(str(tmp / out.name), external_data=big)
        if big:
            report["files"] += [str(out.parent / f.name) for f in tmp.iterdir() if f.name != out.name]
        if check:
            report["max_abs_diff"] = check_onnx(model, tmp / out.name, batch_size=3)
            report["tolerance"] = ONNX_TOLERANCE
            if not report["max_abs_diff"] <= ONNX_TOLERANCE:  # NaN compares false: it fails too
                raise VitlabError(
                    f"ONNX export to {out}: ONNX Runtime's logits differ from PyTorch's by "
                    f"{report['max_abs_diff']:.2e} (max abs), over the tolerance {ONNX_TOLERANCE:.0e}; nothing was "
                    "written"
                )
    return report


def check_onnx(model: nn.Module, path: str | Path, *, batch_size: int = 3, seed: int = 0) -> float:
    """Max abs difference between PyTorch's and ONNX Runtime's logits on random images."""
    try:
        ort = import_onnxruntime()
    except ImportError as e:
        raise VitlabError(
            "checking an ONNX export needs onnxruntime: pip install onnxruntime (or pass check=False)"
        ) from e
    C, H, W = model.cfg.in_chans, *model.cfg.img_size
    x = torch.randn(batch_size, C, H, W, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = model(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], {"image": x.numpy()})
    if got.shape != expected.shape:
        raise VitlabError(f"ONNX export {path}: output shape {got.shape}, expected {expected.shape}")
    for who, out in (("PyTorch", expected), ("ONNX Runtime", got)):
        if not np.isfinite(out).all():
            raise VitlabError(
                f"ONNX export {path}: {who}'s logits are not finite (NaN or infinity), so nothing can be "
                "checked; the model's weights overflow"
            )
    return float(abs(got - expected).max())


__all__ = [
    "check_export",
    "export_model",
    "export_safetensors",
    "export_onnx",
    "check_onnx",
    "export_config",
    "ONNX_TOLERANCE",
]
