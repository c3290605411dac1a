"""`vitlab reproduce`: the paper's claims, tested at laptop scale on real images, in one report.

Each claim below becomes an `Experiment`, a set of
training runs over seeds, a table of mean +- std, a figure, and a verdict computed from the numbers
by the claim's rules (`Rule` objects of `verdicts.py`'s v2 set, in the claim's module, whose text is the report's
rule), with the v1 rules' verdict beside it, and the claim's record of changes (`history`: every change since the
rules were first committed, and whether a result had been seen before it):

    1 x_pos_embed   the mini experiment: dataset X >= 95% val acc; without position embedding, chance
    2 pos_embed     Table 8 on Fashion-MNIST: none clearly worse; learned 1-D / 2-D / sin-cos 2-D / relative close
    3 cls_vs_gap    Appendix D.3: class token = global average pooling, each at its own lr
    4 patch_size    Section 3.1: patches of 14, 7, 4 pixels: longer sequences, more compute, more accuracy
    5 data_scale    Figures 3-4: the CNN wins on 1,000 images; the gap closes by 60,000
    6 pretrain      Section 3.2: pre-train on Fashion-MNIST, fine-tune on 500 digits, beat scratch
    7 hybrid        Section 3.1 / Section 4.4, Table 6: a conv stem helps the ViT on small data
    8 attention     Figure 7 on the ViT trained on all 60,000: attention distance grows with depth; 2-D position
                    embeddings; the embedding filters
    9 recipe        DeiT: MixUp/CutMix, RandAugment and stochastic depth matter more for a ViT on
                    small data than for a CNN

Claims 2-9 share one Fashion-MNIST setup (`claims/shared.py`): one ViT, one CNN, one optimiser, and
the data-scale grid of claim 5, whose runs are the baseline arms of the others. Their recipe and step
budgets come from the recipe search (`search`, `vitlab reproduce --tune`) on 10,000 training images held
out from the other 50,000, never the test images; every arm of a comparison trains the same number of
optimizer steps, and each claim's report shows its arms at their budget and at twice it. Three scales:
`quick` (every code path in minutes; its verdicts mean nothing), `default` (the report), `large` (every
budget doubled: the default's own check).

Runs are cached one by one under `<out>/cache/runs/<hash of the run's configuration>/`, each an ordinary vitlab
run folder (last.json and its checkpoint, which `vitlab.create_model(checkpoint=...)` loads) with its result.json:
an experiment whose runs are all there is not rerun, and an interrupted run of the whole report resumes where it
stopped. Tables, figures and verdicts are recomputed from the cached
numbers every time, so the report can be rewritten without training anything.

Cost: the plan is priced before anything trains (a few timed steps per architecture and augmentation,
times the number of images each run sees); the estimate is printed first and a progress bar follows it.

The package, one concept per module: `verdicts` (the verdict rules, v2 and v1), `history` (the record of changes),
`probes` (few-shot linear probes of the trained models), `recompute` (v2 verdicts from a report's CSV files),
`runs` (one training run, `Run`: its
data, model and `Recipe`, and the run cache), `claims` (one module per claim: its plan, analysis and `Experiment`
entry with its hooks into the search; `EXPERIMENTS`),
`search` (the recipe search and its record, search.json), `figures`, `report` (Markdown and HTML) and
`runner` (the plan, cost estimate, executor, `reproduce()`).
"""

from __future__ import annotations

from vitlab.experiments.reproduce.claims import EXPERIMENTS, experiment_names, select
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale, SearchChoice
from vitlab.experiments.reproduce.claims.claim8_attention import pe_structure
from vitlab.experiments.reproduce.runner import reproduce
from vitlab.experiments.reproduce.runs import (
    BASE_RECIPE,
    CACHE_VERSION,
    Run,
    RunCache,
    build_model,
    inference_ms,
    train_run,
)
from vitlab.experiments.reproduce.verdicts import (
    INCONCLUSIVE,
    MARGIN,
    NOT_REPRODUCED,
    REPRODUCED,
    TOL,
    Rule,
    Verdict,
    at_least,
    at_least_v1,
    close,
    close_v1,
    combine,
    greater,
    greater_v1,
    near,
    near_v1,
)

__all__ = [
    "BASE_RECIPE",
    "CACHE_VERSION",
    "EXPERIMENTS",
    "Experiment",
    "INCONCLUSIVE",
    "MARGIN",
    "NOT_REPRODUCED",
    "Outcome",
    "REPRODUCED",
    "Results",
    "Run",
    "RunCache",
    "Scale",
    "SearchChoice",
    "TOL",
    "Rule",
    "Verdict",
    "at_least",
    "at_least_v1",
    "build_model",
    "close",
    "close_v1",
    "combine",
    "experiment_names",
    "inference_ms",
    "greater",
    "greater_v1",
    "near",
    "near_v1",
    "pe_structure",
    "reproduce",
    "select",
    "train_run",
]
