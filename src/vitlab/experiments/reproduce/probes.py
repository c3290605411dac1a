"""Few-shot linear probes of the models `vitlab reproduce` trained: the paper's own measure of a representation
(Section 4.1, Metrics; Table 8 and Figure 9 report ImageNet 5-shot linear-probe accuracy), on frozen pre-logit
features (`vitlab.analysis.probe`).

For a run's model, three sets of images:

    shots      the pool the k images per class are drawn from: the run's own training images (on the digits, the
               transfer probe of claims 2, 3 and 6, the training digits of `shared.digits_data`, claim 6's
               fine-tuning set)
    held out   where the ridge strength is chosen: Fashion-MNIST's 10,000 training images held out for the recipe
               search (`search_split`), less any the run trained on (the first HELD_OUT_QUICK at the quick scale);
               on the digits, the DIGITS_HELD_OUT digits claims choose on
    test       the run's validation images, the ones its test accuracy (the verdicts') is measured on

and `linear_probe` at 1, 5, 10 and 25 images per class (1 and 2 at the quick scale, whose training sets are too
small for more), DRAWS draws of the shots per seed. Each probe is kept as a small JSON file under the report's
cache (`<cache>/probes/`), named by a hash of what it depends on, so a re-render costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from vitlab.analysis.probe import features, linear_probe
from vitlab.data.fashion_mnist import nested_subset
from vitlab.data.memory import ImageTensors
from vitlab.data.subsets import HELD_OUT, ExperimentData, experiment_splits, search_split
from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.runs import Run, RunCache, build_model, transforms
from vitlab.experiments.reproduce.verdicts import LEVEL, estimate, stats
from vitlab.fileio import write_json

SHOTS = {"quick": (1, 2), "full": (1, 5, 10, 25)}  # images per class
DECIDING_SHOTS = {"quick": 2, "full": 5}  # the shot count claims decide on: Table 8's and Figure 9's 5-shot
DRAWS = 5  # draws of the shots per seed
HELD_OUT_QUICK = 500  # held-out images that choose the ridge strength at the quick scale
PROBE_VERSION = 1  # part of every cached probe's name: a change to how a probe is computed makes new files


def shots(quick: bool) -> tuple[int, ...]:
    return SHOTS["quick" if quick else "full"]


def deciding_shots(quick: bool) -> int:
    return DECIDING_SHOTS["quick" if quick else "full"]


def held_out_images(run: Run, n: int) -> ImageTensors:
    """The first `n` of Fashion-MNIST's held-out training images (search_split's 10,000) that the run did not train
    on, in the held-out order."""
    held_idx = search_split()[1]
    trained = nested_subset(60_000, run.n_train, seed=run.seed)
    keep = torch.nonzero(~torch.isin(held_idx, trained)).flatten()[:n]
    if len(keep) == 0:
        raise VitlabError(f"run: trained on all {HELD_OUT:,} held-out images; no images to choose a ridge strength on")
    search = ExperimentData("fashion-mnist", n_train=1, n_val=HELD_OUT, img_size=28, channels=1, split="search")
    return experiment_splits(search, 0)[1].subset(keep)


def _probe(model: nn.Module, run: Run, sets: Sequence[ImageTensors], *, quick: bool, seed: int) -> dict[int, dict]:
    """`linear_probe` of `model`'s features of (shots pool, held out, test), each preprocessed by the run's eval
    transform."""
    feats = []
    for images in sets:
        x = transforms(run, model, images.size)[1](images.images, {})  # (N, C, H, W), normalised as in evaluation
        f, _ = features(model, x)  # (N, F)
        feats += [f, images.labels]
    out = linear_probe(*feats, shots=shots(quick), draws=DRAWS, seed=seed)
    return {
        k: {"test_acc": v["test_acc"], "test_acc_per_draw": v["test_acc_per_draw"], "l2": v["l2"]}
        for k, v in out.items()
    }


def _path(cache: RunCache, what: dict) -> Path:
    """Where the probe named by `what` is kept: `<cache>/probes/<hash of what>.json`."""
    name = hashlib.sha256(json.dumps({**what, "version": PROBE_VERSION}, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache.cache_dir) / "probes" / f"{name}.json"


def _cached(cache: RunCache, what: dict, compute) -> dict[int, dict]:
    """The probe named by `what` from `<cache>/probes/`, or computed and kept there."""
    path = _path(cache, what)
    if path.is_file():
        return {int(k): v for k, v in json.loads(path.read_text())["probe"].items()}
    result = compute()
    write_json(path, {"what": what, "probe": {str(k): v for k, v in result.items()}}, indent=1)
    return result


def fashion_probe(cache: RunCache, run: Run, device: torch.device, *, quick: bool) -> dict[int, dict]:
    """A Fashion-MNIST run's trained model, probed: shots from its own training images, the ridge strength chosen on
    the held-out training images it did not train on, accuracy on its test images. {k: {"test_acc": mean over the
    draws, "test_acc_per_draw", "l2"}}."""
    if run.data.name != "fashion-mnist" or run.data.split != "test":
        raise VitlabError(f"run: a Fashion-MNIST run validated on the test images expected; found {run.data}")
    n_held = HELD_OUT_QUICK if quick else HELD_OUT

    def compute():
        train, test, _ = experiment_splits(run.data, run.seed)
        model = cache.load_model(run).to(device)
        return _probe(model, run, (train, held_out_images(run, n_held), test), quick=quick, seed=1000 * run.seed)

    return _cached(cache, {"run": run.key, "held_out": n_held, "shots": shots(quick), "draws": DRAWS}, compute)


def _digits_what(run: Run, digits: ExperimentData, *, random_init: bool, quick: bool) -> dict:
    what = {"run": run.key, "digits": [digits.n_train, digits.n_val], "random_init": random_init}
    return {**what, "shots": shots(quick), "draws": DRAWS}


def has_digits_probe(cache: RunCache, run: Run, digits: ExperimentData, *, quick: bool) -> bool:
    """Whether `cache` keeps the run's trained model's `digits_probe`, so that it needs no weights."""
    return _path(cache, _digits_what(run, digits, random_init=False, quick=quick)).is_file()


def digits_probe(
    cache: RunCache, run: Run, digits: ExperimentData, device: torch.device, *, random_init: bool, quick: bool
) -> dict[int, dict]:
    """A Fashion-MNIST run's model probed on the digits of `digits` (split "test": its training digits for the
    shots, the DIGITS_HELD_OUT held-out digits for the ridge strength, its validation digits for the accuracy), for
    the run's seed; `random_init`: the same architecture as initialised before any training (seeded by the run's
    seed, as its training run was), instead of the trained weights."""
    held = ExperimentData(
        digits.name, digits.n_train, 1797, digits.img_size, digits.channels, split="held_out"
    )  # n_val: all DIGITS_HELD_OUT of them

    def compute():
        train, test, n_classes = experiment_splits(digits, run.seed)
        if random_init:
            torch.manual_seed(run.seed)
            model = build_model(run, n_classes).to(device)
        else:
            model = cache.load_model(run).to(device)
        sets = (train, experiment_splits(held, run.seed)[1], test)
        return _probe(model, run, sets, quick=quick, seed=1000 * run.seed)

    return _cached(cache, _digits_what(run, digits, random_init=random_init, quick=quick), compute)


def probe_acc(probes: Sequence[dict[int, dict]], k: int) -> list[float]:
    """Per seed, the k-shot test accuracy (the mean over the draws)."""
    return [p[k]["test_acc"] for p in probes]


def mean_interval(values: Sequence[float], level: float = LEVEL) -> str:
    """ "mean [lo, hi]" in %: the mean over seeds and its `level` t-interval (df n - 1); the mean alone for one."""
    m, _, n = stats(values)
    if n == 0:
        return "n/a"
    est = estimate(values, 0.0, paired=False)
    if est is None or not math.isfinite(est.se):
        return f"{100 * m:.1f}"
    lo, hi = est.interval(level)
    return f"{100 * m:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def probe_table(
    arms: dict[str, Sequence[dict[int, dict]]], *, level: float = LEVEL
) -> tuple[list[str], list[list[str]]]:
    """The probe table: a row per shot count, a column per arm, each cell the k-shot probe accuracy's mean over seeds
    and its `level` t-interval (%). `arms`: {arm: its per-seed probes}."""
    ks = sorted({k for probes in arms.values() for p in probes for k in p})
    header = ["images per class"] + [f"{arm}: probe acc % (mean [{100 * level:g}% CI])" for arm in arms]
    rows = [[str(k)] + [mean_interval(probe_acc(arms[a], k), level) for a in arms] for k in ks]
    return header, rows


__all__ = [
    "DECIDING_SHOTS",
    "DRAWS",
    "SHOTS",
    "deciding_shots",
    "digits_probe",
    "fashion_probe",
    "has_digits_probe",
    "held_out_images",
    "mean_interval",
    "probe_acc",
    "probe_table",
    "shots",
]
