"""The fast path a command takes, `--fast-path`, said out loud:

    auto      (the default, `DEFAULT_FAST_PATH`) the plan `vitlab.speed.rules` gives this kind of machine, this
              precision, batch and run length: fixed rules, nothing timed, so the same command gives the same
              numbers
    tuned     the plan `vitlab tune` measured fastest on this machine for this model, precision and batch
              (measured first, before the run starts, when it has not been)
    compile   the rules' plan, compiled (torch.compile; inference with freezing)
    eager     the rules' plan, never compiled
    off       the model exactly as built

`choose_plan` is the one place a word becomes a plan, for a model and a run (what "auto" means is decided
there, from the rules' table); `InferenceRunner` runs the batches of an inference run on it (`vitlab
predict`, `attention`, `inspect`), `serving_model` readies a copy for a server that answers one image at a
time (`vitlab serve`), and `fit` trains in `vitlab.speed.paths.training`. Each says its plan in one line,
and a training run records it (`summary.json`, its checkpoints).

A library function that runs a model takes its fast path as a `FastPath`: one of the words above (the plan
is chosen for the run, which the function alone knows the length and batch of), a `Plan` chosen already, or
None, the model exactly as built. Every such function, and every command's `--fast-path`, defaults to the
one constant `DEFAULT_FAST_PATH`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from vitlab.errors import VitlabError
from vitlab.options import DEFAULT_FAST_PATH, FAST_PATHS
from vitlab.runtime import autocast
from vitlab.speed import tune as T
from vitlab.speed.machine import this_machine
from vitlab.speed.paths import family, inference_fn, is_vit_on_cpu, usable
from vitlab.speed.rules import AS_BUILT, Plan, plan_by_rules

FastPath = str | Plan | None  # a word of FAST_PATHS, a Plan chosen already, or None: the model exactly as built


def check_fast_path(fast: FastPath) -> FastPath:
    if not (fast is None or isinstance(fast, Plan) or (isinstance(fast, str) and fast in FAST_PATHS)):
        raise VitlabError(
            f"fast_path must be one of {', '.join(FAST_PATHS)}, a vitlab.speed.rules.Plan, or None (the model as "
            f"built); found {fast!r}",
            arg="fast_path",
        )
    return fast


def flops_per_image(model: nn.Module) -> float:
    """A ViT's forward FLOPs per image, roughly (the products: 2 x weights x tokens, and attention's two
    products); what the rules compare with their thresholds. A CNN: 0 (it runs as built)."""
    cfg = getattr(model, "cfg", None)
    if not hasattr(cfg, "num_patches"):
        return 0.0
    n = cfg.num_patches + cfg.num_prefix_tokens
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 2.0 * weights * n + 4.0 * cfg.depth * n * n * cfg.dim


def choose_plan(
    model: nn.Module,
    *,
    fast: FastPath,
    mode: str,
    precision: str,
    batch_size: int,
    items: int,
    device: torch.device,
    log: Callable[[str], None] | None = None,
) -> Plan:
    """The plan of a run of `items` images (inference) or training steps (train) of `batch_size` images, for
    `fast` (a FastPath): a word of FAST_PATHS chosen here, a Plan taken as it is, None the model as built.
    Each less what cannot run for `model` here (`vitlab.speed.paths.usable`)."""
    check_fast_path(fast)
    if isinstance(fast, Plan):
        return usable(fast, model, precision, mode)
    if fast is None or fast == "off":
        return replace(AS_BUILT, source="as built" if fast is None else "--fast-path off")
    plan = plan_by_rules(
        this_machine(),
        mode=mode,
        precision=precision,
        batch_size=batch_size,
        flops_per_item=flops_per_image(model),
        items=items,
        device_type=device.type,
        family=family(model),
    )
    if fast == "tuned" and is_vit_on_cpu(model):
        plan = T.known(model, mode=mode, precision=precision, batch_size=batch_size) or T.tune(
            model, mode=mode, precision=precision, batch_size=batch_size, default=plan, log=log
        )
    elif fast == "compile":
        plan = replace(plan, compile=True, source=f"{plan.source}; compiled as asked")
    elif fast == "eager":
        plan = replace(plan, compile=False, pieces=0, source=f"{plan.source}; not compiled, as asked")
    return usable(plan, model, precision, mode)


class InferenceRunner:
    """Batches of images through `model` on the plan `choose_plan` gives a run of `images` images in batches
    of `batch_size` (call it like the model, under the caller's autocast and inference mode). `method`:
    what a call runs (the model's forward, or e.g. its forward_features). `model` itself is left as it is."""

    def __init__(
        self,
        model: nn.Module,
        *,
        precision: str,
        batch_size: int,
        images: int,
        device: torch.device,
        fast: FastPath = DEFAULT_FAST_PATH,
        method: str = "forward",
        log: Callable[[str], None] | None = None,
    ):
        batch_size = max(1, min(batch_size, images))
        self.plan = choose_plan(
            model,
            fast=fast,
            mode="inference",
            precision=precision,
            batch_size=batch_size,
            items=images,
            device=device,
            log=log,
        )
        self.fn = inference_fn(model, self.plan, precision=precision, batch_size=batch_size, method=method)

    def __call__(self, x: torch.Tensor, *args, **kwargs):
        return self.fn(x, *args, **kwargs)

    def describe(self) -> str:
        return self.plan.describe()


def serving_model(
    model: nn.Module, *, precision: str, device: torch.device, fast: FastPath = DEFAULT_FAST_PATH
) -> tuple[Callable, str]:
    """What answers a server's requests, one image at a time, and its path in words; `model` is left as it
    is (the attention maps need it so). How long a server runs is not known, so the rules do not compile
    it; `compile` (or a tuned plan that compiles) compiles here and now, for a batch of one."""
    plan = choose_plan(model, fast=fast, mode="inference", precision=precision, batch_size=1, items=1, device=device)
    fn = inference_fn(model, plan, precision=precision, batch_size=1)
    if plan.compile:
        cfg = model.cfg
        with torch.inference_mode(), autocast(device, precision):
            fn(torch.zeros(1, cfg.in_chans, *cfg.img_size, device=device))  # the compile, before the first request
    return fn, plan.describe()


__all__ = ["FastPath", "check_fast_path", "choose_plan", "flops_per_image", "InferenceRunner", "serving_model"]
