"""What this machine is: its CPU's name, vendor and instruction-set flags, read once per process, and the
kind they make. The kind is what the rules of `vitlab.speed.rules` are written for:

    amx          an Intel Xeon with AMX (amx_tile): bf16 matrix products in hardware tiles
    avx512-bf16  AVX-512 with bf16 dot products (avx512_bf16) but no AMX: AMD Zen 4 and 5, Intel Cooper Lake
    avx512       AVX-512 without bf16 products
    avx2         AVX2 and FMA only: AMD EPYC before Zen 4, Intel before Skylake-SP; bf16 is emulated
    other        anything else (ARM, an old x86)

The vendor matters as much as the kind: torch's fp32 matrix products go to Intel's MKL on x86, which
runs far below the CPU's rate on AMD processors, while oneDNN (also in every x86 torch build) does not
look at the vendor (`vitlab.speed.rules`).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import re
from dataclasses import dataclass

import torch

KINDS = ("amx", "avx512-bf16", "avx512", "avx2", "other")


@dataclass(frozen=True)
class Machine:
    cpu: str  # the model name the OS reports (`lscpu`'s "Model name")
    vendor: str  # "intel", "amd" or "other"
    kind: str  # one of KINDS
    flags: frozenset[str]

    @property
    def slug(self) -> str:
        """A file-name-safe name of this CPU and torch build (the tuning file's name)."""
        name = re.sub(r"[^a-z0-9]+", "-", self.cpu.lower()).strip("-")
        digest = hashlib.sha1(" ".join(sorted(self.flags)).encode()).hexdigest()[:8]
        return f"{name}-{digest}-torch-{re.sub(r'[^A-Za-z0-9.+]+', '-', torch.__version__)}"

    def describe(self) -> str:
        return f"{self.cpu} ({self.kind}, {self.vendor})"


def kind_of(flags: frozenset[str]) -> str:
    if "amx_tile" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512-bf16" if "avx512_bf16" in flags else "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "other"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux); {} elsewhere."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def this_machine() -> Machine:
    """This machine, read once per process (reading /proc/cpuinfo costs ~0.2 ms)."""
    info = _cpuinfo()
    flags = frozenset((info.get("flags") or info.get("Features") or "").split())
    if not flags:  # not Linux: what torch's CPU dispatch found, as the one flag we know
        flags = frozenset({torch.backends.cpu.get_cpu_capability().lower()})
    vendor_id = info.get("vendor_id", "")
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor_id, "other")
    cpu = info.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    return Machine(cpu=cpu, vendor=vendor, kind=kind_of(flags), flags=flags)


__all__ = ["KINDS", "Machine", "kind_of", "this_machine"]
