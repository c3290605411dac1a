"""Device, precision and seeding: the few things every command needs the same way."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from vitlab.errors import VitlabError

PRECISIONS = ("fp32", "bf16")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device that is not there is an error."""
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise VitlabError(f"--device {device!r} is not a device; expected auto, cpu, cuda, cuda:N or mps") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VitlabError(f"--device {device} asked for CUDA but no CUDA GPU is visible; use --device cpu or auto")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise VitlabError(f"--device {device} asked for MPS but it is not available; use --device cpu or auto")
    return dev


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CPU or GPU for `bf16`; nothing for `fp32`."""
    if precision not in PRECISIONS:
        raise VitlabError(f"--precision must be one of {', '.join(PRECISIONS)}; found {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch, so the same seed and config give the same numbers on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
