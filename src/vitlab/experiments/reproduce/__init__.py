"""`vitlab reproduce`: every claim of the paper and the seeds, tested at laptop scale, in one report.

Read the paper thin, then thick (seed 000): each claim below becomes an `Experiment`, a set of
training runs over seeds, a table of mean +- std, a figure, and a verdict computed from the numbers
by a rule fixed before any result was seen (`VERDICT RULES` in `verdicts.py`):

    1 x_pos_embed   seed 000 s5: dataset X >= 95% val acc; without position embedding, chance
    2 pos_embed     Table 8: none clearly worse, learned 1-D / 2-D / sincos 2-D / relative close
    3 cls_vs_gap    Appendix D.3: class token = global average pooling, each at its own lr
    4 patch_size    Section 3.1 / seed 000 s4.2: smaller patches, longer sequences, more accuracy
    5 data_scale    Figures 3-4: the CNN wins on little data; the gap closes as data grows
    6 pretrain      seed 004 s6: pre-train on the large synthetic set, fine-tune on 500 digits
    7 hybrid        Section 3.1 / seed 004 s8: a conv stem helps the ViT on small data
    8 attention     Figure 7: attention distance grows with depth; learned position embeddings are 2-D

Runs are cached one by one under `<out>/cache/runs/<hash of the run's configuration>/` (result.json
and the weights): an experiment whose runs are all there is not rerun, and an interrupted run of the
whole report resumes where it stopped. Tables, figures and verdicts are recomputed from the cached
numbers every time, so the report can be rewritten without training anything.

Cost: the plan is priced before anything trains (a few timed steps per architecture, times the
number of images each run sees); the estimate is printed first and a progress bar follows it.

The package, one concept per module: `verdicts` (the pre-registered rules), `runs` (one training run and
the run cache), `claims` (one module per claim: its plan, analysis and `Experiment` entry; `EXPERIMENTS`),
`figures`, `report` (Markdown and HTML) and `runner` (the plan, cost estimate, worker pool, `reproduce()`).
"""

from __future__ import annotations

from vitlab.experiments.reproduce.claims import EXPERIMENTS, experiment_names, select
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.claim8_attention import pe_structure
from vitlab.experiments.reproduce.runner import reproduce
from vitlab.experiments.reproduce.runs import (
    CACHE_VERSION,
    RunCache,
    RunSpec,
    build_model,
    execute_run,
    forward_flops,
    run_spec,
)
from vitlab.experiments.reproduce.verdicts import (
    INCONCLUSIVE,
    MARGIN,
    NOT_REPRODUCED,
    REPRODUCED,
    TOL,
    Verdict,
    at_least,
    close,
    combine,
    greater,
    near,
)


__all__ = [
    "CACHE_VERSION",
    "EXPERIMENTS",
    "Experiment",
    "INCONCLUSIVE",
    "MARGIN",
    "NOT_REPRODUCED",
    "Outcome",
    "REPRODUCED",
    "Results",
    "RunCache",
    "RunSpec",
    "Scale",
    "TOL",
    "Verdict",
    "at_least",
    "build_model",
    "close",
    "combine",
    "execute_run",
    "experiment_names",
    "forward_flops",
    "greater",
    "near",
    "pe_structure",
    "reproduce",
    "run_spec",
    "select",
]
