"""Training: the one engine (`fit`, engine.py), the recipes it follows (recipe.py), the optimiser and its
schedule (optim.py), a run on a dataset as the commands start it (job.py), several processes
(distributed.py), what a run ends with (report.py, diagnostics.py).

Each name below loads from its module on first use (PEP 562), as `vitlab`'s do: `vitlab.train.recipe`, which
imports no torch, gives the command line its defaults without loading the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for readers and tools; at run time each name loads on first use
    from vitlab.train.engine import Callback, History, TensorLoader, TrainState, evaluate, fit, train_one_epoch
    from vitlab.train.job import TrainJob, run
    from vitlab.train.recipe import RECIPES, Recipe

# name -> the module of this package that defines it
_API = {
    **dict.fromkeys(
        ["Callback", "History", "TensorLoader", "TrainState", "evaluate", "fit", "train_one_epoch"], "engine"
    ),
    **dict.fromkeys(["RECIPES", "Recipe"], "recipe"),
    **dict.fromkeys(["TrainJob", "run"], "job"),
}


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        globals()[name] = value  # once loaded, an ordinary attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_API)
