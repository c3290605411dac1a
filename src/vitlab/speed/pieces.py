"""A batch run through the model a few images at a time, when that is faster on this CPU.

A forward pass over a whole batch keeps the whole batch's activations in flight between two layers:
at batch 32, ViT-B/16's MLP hidden layer is 32 x 197 x 3072 floats, 77 MB, far past a core's caches,
so every LayerNorm, GELU, bias and residual sum streams through main memory, and every product reads
its input from there. Run in pieces of a few images, the same layers work on a few MB that stay in
the cache. Each image meets the same products on the same weights, so the outputs are the whole
batch's to float rounding (tested: 1e-5 in fp32).

On an Intel Xeon with AMX (one thread, 32 images, torch 2.14), pieces of 4 ran ViT-S/16 1.11-1.17x
and ViT-B/16 1.09x faster than the whole batch in fp32, compiled with freezing
(`benchmarks/compiled_variants.py`), and ViT-S/16 1.24x on the packed uncompiled model (each piece size
packed for its rows); in bf16, pieces of 8-16 ran ViT-S/16 1.03-1.11x. How much, and at what
size, depends on the CPU's caches and kernels, so the size is measured here (`choose_pieces`): the
model's forward pass at each candidate size (the batch itself, the default, and the powers of two
below it), scored per image, once per model, precision, batch and thread count
(`vitlab.speed.calibration`). One encoder block timed alone does not tell: with its few MB of weights
and activations warm in a large cache, it found the whole batch as fast for ViT-B/16 in fp32, where
the whole model ran pieces of 4-8 1.09x faster. Nor does a copy whose weights are packed for the whole
batch's rows (MKL's packed GEMM takes the row count): it favours the whole batch.

The uncompiled model gains less from pieces than the compiled graph does (2-5% for ViT-S/16 fp32,
within the noise of its measurement, where the compiled graph gained 1.17x), so a compiled model's
piece size is measured on the compiled graph (`choose_compiled_pieces`), at the cost of a compile per
size tried; `vitlab bench`, which compiles anyway, does that, and a command that compiles uses its
answer.
"""

from __future__ import annotations

import copy
import time
from functools import partial
from typing import Callable

import torch
from torch import nn

from vitlab.models.vit import VisionTransformer
from vitlab.runtime import autocast
from vitlab.speed import cpu_inference
from vitlab.speed.calibration import MARGIN, Calibration, calibration, measure, threads_tag
from vitlab.speed.compiled import FIRST_COMPILE_SHARE, signature


def _cat(outputs: list):
    """The outputs of the pieces, joined along the batch: tensors, and tuples, lists or dicts of them
    (e.g. `forward_features(x, return_attention=...)`'s (features, [attention per layer]))."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(list(parts)) for parts in zip(*outputs))
    if isinstance(first, dict):
        return {k: _cat([o[k] for o in outputs]) for k in first}
    if first is None:
        return None
    raise TypeError(f"cannot join outputs of type {type(first).__name__} along the batch")


def in_pieces(fn: Callable, x: torch.Tensor, size: int, *args, **kwargs):
    """`fn(x, *args, **kwargs)`, computed `size` images of `x` at a time (the last piece may be smaller)."""
    if x.shape[0] <= size:
        return fn(x, *args, **kwargs)
    return _cat([fn(piece, *args, **kwargs) for piece in x.split(size)])


def candidate_sizes(batch_size: int) -> list[int]:
    """The batch itself (the default), then the powers of two below it, largest first."""
    powers = [2**k for k in range(batch_size.bit_length()) if 2**k < batch_size]
    return [batch_size] + powers[::-1]


def measuring_cost(batch_size: int) -> int:
    """The most images `choose_pieces` runs to measure: two rounds of a warm-up and three repeats, over
    every candidate size."""
    return 2 * 4 * sum(candidate_sizes(batch_size))


def choose_pieces(model: nn.Module, *, precision: str, batch_size: int, cal: Calibration | None = None,
                  images: int | None = None) -> int:
    """How many images of a batch of `batch_size` to run through `model` at a time for inference on this
    CPU: the batch itself unless fewer measured faster here (see the module docstring). Measured on a copy
    of the model with the attention kernel it has now and its Linear weights packed (by oneDNN, for any
    number of rows, so that no size is favoured by the weights' layout), a forward pass of random images
    at each size, scored per image; the answer is kept.

    `images`: the run's length. A size never measured here is measured only when that costs at most
    `FIRST_COMPILE_SHARE` of the run (`measuring_cost`); a shorter run takes whole batches. A model that is
    not a ViT on the CPU runs whole batches."""
    if (not isinstance(model, VisionTransformer) or batch_size <= 1
            or next(model.parameters()).device.type != "cpu"):
        return batch_size
    cal = cal or calibration()
    c = model.cfg
    sizes = candidate_sizes(batch_size)
    key = f"infer-pieces/{signature(model)}/{precision}/{threads_tag()}/b{batch_size}"
    names = [str(s) for s in sizes]
    known = cal.known(key, names)
    if known is not None:
        return int(known)
    if images is not None and images * FIRST_COMPILE_SHARE < measuring_cost(batch_size):
        return batch_size
    measured = copy.deepcopy(model).eval()
    if cpu_inference.supported(precision):  # packed for any row count: no size favoured by the weights' layout
        cpu_inference.pack_for_cpu_inference(measured, precision, measure=False)
    x = torch.randn(batch_size, c.in_chans, *c.img_size, generator=torch.Generator().manual_seed(0))

    def run(size: int):  # one piece of `size` images, scored per image
        def fn() -> None:
            with torch.inference_mode(), autocast(torch.device("cpu"), precision):
                measured(x[:size])

        return fn

    return int(cal.choose(key, {name: run(size) for name, size in zip(names, sizes)}, items=dict(zip(names, sizes))))


def _compiled_key(model: nn.Module, precision: str, batch_size: int) -> str:
    return f"infer-pieces-compiled/{signature(model)}/{precision}/{threads_tag()}/b{batch_size}"


def known_compiled_pieces(model: nn.Module, *, precision: str, batch_size: int,
                          cal: Calibration | None = None) -> int | None:
    """The piece size `choose_compiled_pieces` measured here for `model`'s compiled graph, or None."""
    entry = (cal or calibration()).get(_compiled_key(model, precision, batch_size))
    choice = entry.get("choice") if entry else None
    return int(choice) if choice in {str(s) for s in candidate_sizes(batch_size)} else None


def choose_compiled_pieces(compiled: Callable, model: nn.Module, *, precision: str, batch_size: int,
                           cal: Calibration | None = None) -> tuple[int, dict[int, float]]:
    """How many images of a batch of `batch_size` to run at a time through `compiled`, `model` compiled for
    inference (`vitlab.speed.compiled.compile_model`), measured on the compiled graph itself: the batch,
    then half of it, and so on while the half runs faster per image by any amount (a step of 3% or
    less is common, e.g. ViT-S/16 bf16 from 32 to 16 on an Intel Xeon), then the fastest size found
    against the whole batch, side by side: it is chosen when it beats it by `MARGIN`, in two rounds
    (`calibration.measure`). Each size is a graph of its own, compiled here at its first call (tens of
    seconds each), which is why `vitlab bench`, which compiles anyway, measures this and a command does
    not; a command that compiles reads the answer (`known_compiled_pieces`).

    Returns the size and, for each size compiled now, the seconds of its first call (the compile and one
    piece). A size measured here before is returned at once, with nothing compiled."""
    cal = cal or calibration()
    key = _compiled_key(model, precision, batch_size)
    known = known_compiled_pieces(model, precision=precision, batch_size=batch_size, cal=cal)
    if known is not None:
        return known, {}
    c = model.cfg
    x = torch.randn(batch_size, c.in_chans, *c.img_size, generator=torch.Generator().manual_seed(0))

    def run(size: int) -> None:  # one piece of `size` images
        with torch.inference_mode(), autocast(torch.device("cpu"), precision):
            compiled(x[:size])

    first: dict[int, float] = {}

    def compile_at(size: int) -> None:
        t0 = time.perf_counter()
        run(size)
        first[size] = time.perf_counter() - t0

    def race(a: int, b: int, margin: float) -> dict:
        return measure({str(a): partial(run, a), str(b): partial(run, b)}, items={str(a): a, str(b): b},
                       margin=margin)

    # at most as many graphs as dynamo keeps for one code object (beyond, it would run uncompiled)
    sizes = candidate_sizes(batch_size)[:torch._dynamo.config.cache_size_limit]
    best, seconds = sizes[0], {}
    compile_at(best)
    for size in sizes[1:]:  # down while a half is faster at all: each step may gain less than the noise
        compile_at(size)
        entry = race(best, size, margin=0.0)
        seconds.update(entry["seconds"])
        if entry["choice"] == str(best):
            break
        best = size
    if best != batch_size:  # the way down's best against the whole batch, side by side: it must beat it clearly
        entry = race(batch_size, best, margin=MARGIN)
        seconds.update(entry["seconds"])
        best = int(entry["choice"])
    cal.put(key, {"choice": str(best), "seconds": seconds})
    return best, first


__all__ = ["choose_pieces", "choose_compiled_pieces", "known_compiled_pieces", "in_pieces", "candidate_sizes",
           "measuring_cost"]
