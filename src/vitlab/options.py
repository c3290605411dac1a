"""The values vitlab's options take, in a module that imports nothing heavy: the command line builds every
parser (and its `--help`) from these before torch is loaded, and the modules that act on an option import its
values from here, so that each choice is spelled once.

    PRECISIONS, check_precision     fp32, or bf16 autocast (vitlab.runtime.autocast)
    SEED_MAX, check_seed            the seeds a run takes
    FAST_PATHS, DEFAULT_FAST_PATH   --fast-path (what each word means: vitlab.speed.fastpath)
    ENGINES, ENGINE_CHOICES, ...    --engine: what computes an inference run's logits (vitlab.inference.engine)
    INITS, AUTO_AUGMENTS            a Recipe's `init` and `auto_augment` (vitlab.train.recipe)
    DATASETS, DEFAULT_VAL_SPLIT     the bundled datasets (vitlab.data.datasets); a one-folder layout's split
    CLAIMS, SCALES, EXECUTORS       `vitlab reproduce`: its claims by number, its scales, where its runs train
"""

from __future__ import annotations

from vitlab.errors import VitlabError, check_range

PRECISIONS = ("fp32", "bf16")
# Seeds are 0 .. 2^32 - 1: NumPy's range, and small enough that every seed vitlab derives from one (a
# shuffle's seed * 100,003 + epoch, a process's seed + rank) stays inside torch's 64-bit range.
SEED_MAX = 2**32 - 1

FAST_PATHS = ("auto", "tuned", "compile", "eager", "off")
DEFAULT_FAST_PATH = "auto"  # of every command and library function that runs a model: the rules' plan, nothing timed
BENCH_FAST_PATHS = ("auto", "tuned")  # vitlab's fast paths `vitlab bench --ours` measures
ENGINES = ("torch", "onnxruntime")
ENGINE_CHOICES = ("auto", *ENGINES)  # what --engine and the `engine` argument take
DEFAULT_ENGINE = "auto"  # of `vitlab predict`, `vitlab serve` and `predict_files`: the rules' engine

INITS = ("trunc_normal", "jax")  # VisionTransformer.init_weights
AUTO_AUGMENTS = ("none", "rand", "trivial")  # none, RandAugment, TrivialAugmentWide
DATASETS = ("fashion-mnist", "digits", "x")  # the keys of vitlab.data.datasets.BUNDLED
DEFAULT_VAL_SPLIT = 0.2  # the share of each class that goes to validation
PAGE_KINDS = ("checkpoint", "pretrained", "model")  # what the served page's "load" box can name, as the flags

# `vitlab reproduce`: each claim is the module claims/claim<N>_<name>.py of vitlab.experiments.reproduce, whose
# EXPERIMENT has this number and name; this table is the claims' registry (a new claim: its module and a line here)
CLAIMS = {
    1: "x_pos_embed",
    2: "pos_embed",
    3: "cls_vs_gap",
    4: "patch_size",
    5: "data_scale",
    6: "pretrain",
    7: "hybrid",
    8: "attention",
    9: "recipe",
    10: "compute",
    11: "resolution",
}
SCALES = ("quick", "default", "large")
EXECUTORS = ("pool", "ray")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise VitlabError(f"precision must be one of {', '.join(PRECISIONS)}; found {precision!r}", arg="precision")
    return precision


def check_seed(seed, arg: str = "seed") -> int:
    """A seed vitlab can use: an integer in 0 .. SEED_MAX."""
    check_range(arg, seed, low=0, high=SEED_MAX, integer=True)
    return seed
