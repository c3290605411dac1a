"""Eval preprocessing from a model's `pretrained_cfg`, and opening any image file as RGB.

Pretrained weights must be loaded with their own preprocessing, not with normalisation values written
by hand: a mismatch silently costs accuracy (vision_transformer#39:
83.41% vs 85.08% top-1 from the resize alone). Each weight source resizes and normalises its own way:

    source                     resize                          crop               mean / std
    JAX, HF google/vit-*       straight to 224, bilinear       none               0.5 / 0.5
                               (HF's ViTImageProcessor resizes the uint8 tensor, antialiased)
    timm augreg                short side 224/0.9, bicubic     centre 224         0.5 / 0.5
    torchvision vit_b_16       short side 256, bilinear        centre 224         ImageNet

`eval_transform(pretrained_cfg)` builds exactly that with torchvision.transforms.v2, in timm's
arithmetic (scale = floor(size / crop_pct)), on PIL images so the resize is PIL's like timm's, or on
the uint8 tensor like Hugging Face's ViTImageProcessor (`resize_backend`). `open_image(path)` turns
any JPEG/PNG/WebP/BMP/TIFF into an RGB image the same way everywhere, and a bad file into a
VitlabError naming it.
"""

from __future__ import annotations

import errno
import math
import os
import struct
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision.transforms import InterpolationMode, v2

from vitlab.errors import VitlabError
from vitlab.models.pretrained_cfg import PretrainedCfg

INTERPOLATIONS = {
    "nearest": InterpolationMode.NEAREST,
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "lanczos": InterpolationMode.LANCZOS,
}


def eval_transform(pretrained_cfg: PretrainedCfg, img_size: int | tuple[int, int] | None = None) -> v2.Compose:
    """PIL image -> normalised float tensor (C, H, W), as the weights' source preprocessed for eval.

    From the PretrainedCfg: input_size (C, H, W), mean, std, crop_pct, crop_mode ("center": resize
    the short side to size / crop_pct then centre-crop; "squash": resize both sides to size / crop_pct,
    so crop_pct 1.0 is a plain resize to the input size), interpolation, resize_backend ("pil": timm,
    torchvision and the JAX release resize PIL images; "tensor": resize the uint8 tensor with
    torchvision's antialiased kernels, as Hugging Face's ViTImageProcessor does). A one-channel model
    gets the image in grey. img_size overrides the input size (for a model built at another resolution).
    """
    C = pretrained_cfg.in_chans
    return v2.Compose(
        [
            eval_geometry(pretrained_cfg, img_size),
            v2.ToDtype(torch.float32, scale=True),  # [0, 255] -> [0, 1]
            v2.Normalize(mean=list(pretrained_cfg.mean)[:C], std=list(pretrained_cfg.std)[:C]),
        ]
    )


def eval_geometry(pretrained_cfg: PretrainedCfg, img_size: int | tuple[int, int] | None = None) -> v2.Compose:
    """The part of `eval_transform` before the normalisation: PIL image -> uint8 image (C, H, W), resized,
    cropped and (for a one-channel model) turned grey. Data kept in memory is preprocessed with it once."""
    resize_crop = eval_resize_crop(pretrained_cfg, img_size)
    backend = pretrained_cfg.resize_backend
    if backend not in ("pil", "tensor"):
        raise VitlabError(f"pretrained_cfg resize_backend {backend!r} is unknown; expected pil or tensor")
    colour = [v2.Grayscale(num_output_channels=1)] if pretrained_cfg.in_chans == 1 else []  # PIL's convert("L")
    to_image = v2.ToImage()  # PIL (H, W, 3) uint8 -> tv_tensors.Image (3, H, W) uint8
    steps = colour + [resize_crop, to_image] if backend == "pil" else colour + [to_image, resize_crop]
    return v2.Compose(steps)


def eval_resize_crop(pretrained_cfg: PretrainedCfg, img_size: int | tuple[int, int] | None = None) -> v2.Compose:
    """The resize and the centre crop of `eval_transform` (timm's arithmetic: scale = floor(size / crop_pct))."""
    H, W = _size(pretrained_cfg, img_size)
    crop_pct = pretrained_cfg.crop_pct or 0.875
    name = pretrained_cfg.interpolation
    if name not in INTERPOLATIONS:
        raise VitlabError(
            f"pretrained_cfg interpolation {name!r} is unknown; expected one of {', '.join(INTERPOLATIONS)}"
        )
    interpolation = INTERPOLATIONS[name]
    scale = (math.floor(H / crop_pct), math.floor(W / crop_pct))  # timm's arithmetic: 224 / 0.875 = 256
    if pretrained_cfg.crop_mode == "squash":
        resize = v2.Resize(scale, interpolation=interpolation)  # both sides: the aspect ratio is not kept
    elif pretrained_cfg.crop_mode == "center":
        # The short side to the scale (for a non-square input, the larger scale, so the crop fits).
        resize = v2.Resize(max(scale), interpolation=interpolation)
    else:
        raise VitlabError(
            f"pretrained_cfg crop_mode {pretrained_cfg.crop_mode!r} is unknown; expected center or squash"
        )
    return v2.Compose([resize, v2.CenterCrop((H, W))])


def _size(pretrained_cfg: PretrainedCfg, img_size) -> tuple[int, int]:
    if img_size is None:
        return pretrained_cfg.img_size
    return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)


def describe(pretrained_cfg: PretrainedCfg, img_size: int | tuple[int, int] | None = None) -> str:
    """One line saying what eval_transform(pretrained_cfg, img_size) does, for logs and `vitlab predict`."""
    H, W = _size(pretrained_cfg, img_size)
    crop_pct = pretrained_cfg.crop_pct or 0.875
    scale = (math.floor(H / crop_pct), math.floor(W / crop_pct))
    interp = pretrained_cfg.interpolation
    if pretrained_cfg.crop_mode == "squash":
        steps = f"resize to {scale[0]}x{scale[1]} ({interp})" + ("" if scale == (H, W) else f", centre-crop {H}x{W}")
    else:
        steps = f"resize short side to {max(scale)} ({interp}), centre-crop {H}x{W}"
    fmt = lambda v: "(" + ", ".join(f"{x:g}" for x in v) + ")"  # noqa: E731
    C = pretrained_cfg.in_chans
    return f"{steps}, mean {fmt(pretrained_cfg.mean[:C])}, std {fmt(pretrained_cfg.std[:C])}"


def open_image(path: str | Path) -> Image.Image:
    """Open an image file as an RGB PIL image, or raise a VitlabError that names the file.

    EXIF orientation is applied (phones store portraits sideways). Grayscale, palette, CMYK and
    16-bit images are converted to 8-bit RGB by their meaning (16-bit values are scaled, not clipped);
    transparent images are composited on white. Corrupt, truncated, empty and non-image files, and
    images over PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS), are refused.
    """
    path = Path(path).expanduser()
    try:
        size = path.stat().st_size
    except OSError as e:
        raise VitlabError(f"{path}: {_missing(path, e)}") from e
    if not path.is_file():
        raise VitlabError(f"{path}: not a file (expected an image file such as a .jpg or .png)")
    if size == 0:
        raise VitlabError(f"{path}: the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            # PIL only warns between MAX_IMAGE_PIXELS and twice that; treat it as the bomb it may be.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()  # decode now: truncated data fails here (PIL's LOAD_TRUNCATED_IMAGES stays False)
                im = ImageOps.exif_transpose(im)
                return to_rgb(im)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise VitlabError(
            f"{path}: refused as a possible decompression bomb ({e}); if the image is genuine, "
            "downscale it first (the limit is PIL.Image.MAX_IMAGE_PIXELS)"
        ) from e
    except UnidentifiedImageError as e:
        raise VitlabError(f"{path}: not an image file PIL can read (expected JPEG, PNG, WebP, BMP or TIFF)") from e
    except PermissionError as e:
        raise VitlabError(f"{path}: cannot be read (permission denied); check the file's permissions") from e
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        raise VitlabError(f"{path}: corrupt or truncated image ({type(e).__name__}: {e})") from e


def _missing(path: Path, e: OSError) -> str:
    """Why a path cannot be found, in words: a loop of symbolic links, a link to nothing, or nothing."""
    if e.errno == errno.ELOOP:
        return "a loop of symbolic links (the link leads back to itself); point it at an image file"
    if path.is_symlink():
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    if isinstance(e, PermissionError):
        return "cannot be read (permission denied on a folder above it)"
    return "no such file"


def to_rgb(im: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB, by meaning rather than by clipping."""
    mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        arr = np.asarray(im, dtype=np.float64)  # (H, W) integer values
        peak = 65535.0 if mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        return Image.fromarray(np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "F":  # float images: [0, 1] if they look like it, else [0, 255]
        arr = np.asarray(im, dtype=np.float64)
        arr = arr * 255.0 if arr.max(initial=0) <= 1.0 else arr
        return Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))  # transparent pixels -> white
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV, RGB


def images_tensor(images, pretrained_cfg: PretrainedCfg, img_size: int | tuple[int, int] | None = None) -> torch.Tensor:
    """Image files (or PIL images) preprocessed for a model with this PretrainedCfg: (B, C, H, W).
    A file that cannot be read is a VitlabError naming it."""
    transform = eval_transform(pretrained_cfg, img_size)
    return torch.stack([transform(to_rgb(im) if isinstance(im, Image.Image) else open_image(im)) for im in images])


def load_images(paths, transform) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, str]]]:
    """Open and preprocess many files: ([(path, tensor (3, H, W))], [(path, error message)])."""
    good, bad = [], []
    for p in paths:
        try:
            good.append((str(p), transform(open_image(p))))
        except VitlabError as e:
            bad.append((str(p), str(e)))
    return good, bad


__all__ = [
    "eval_transform",
    "eval_geometry",
    "eval_resize_crop",
    "describe",
    "open_image",
    "to_rgb",
    "images_tensor",
    "load_images",
    "INTERPOLATIONS",
]
