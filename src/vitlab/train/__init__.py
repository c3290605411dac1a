"""Training: the one engine (`fit`, engine.py), the recipes it follows (recipe.py), the optimiser and its
schedule (optim.py), a run on a dataset as the commands start it (run.py), several processes
(distributed.py), what a run ends with (report.py, diagnostics.py)."""

from vitlab.train.engine import Callback, History, TensorLoader, TrainState, evaluate, fit, train_one_epoch
from vitlab.train.recipe import RECIPES, Recipe
from vitlab.train.run import TrainJob, run

__all__ = [
    "Callback",
    "History",
    "TensorLoader",
    "TrainState",
    "evaluate",
    "fit",
    "train_one_epoch",
    "RECIPES",
    "Recipe",
    "TrainJob",
    "run",
]
