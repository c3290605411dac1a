"""Few-shot linear probes on frozen features: the paper's own measure of a representation (Section 4.1, Metrics:
"few-shot accuracies are obtained by solving a regularized least-squares regression problem that maps the (frozen)
representation of a subset of training images to {-1, 1}^K target vectors").

    features     a model's pre-logit features (`forward_features`, then `forward_head(pre_logits=True)`), the model
                 left as it was handed in (its weights and every module's train/eval mode)
    fit_ridge    the closed-form ridge regression from features to {-1, +1} targets, one column per class, on
                 features standardised per dimension (the bias, carried by centring, is not penalised); float64
    few_shot     seeded draws of `shots` training images per class
    linear_probe the ridge strength chosen on held-out (val) features, then test accuracy per shot count, the mean
                 over draws and each draw

The solve follows big_vision's fewshot_lsr evaluator: standardise, solve in whichever of the primal (d x d) or dual
(n x n) system is smaller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from vitlab.errors import VitlabError

L2_GRID = tuple(2.0**i for i in range(-10, 20, 2))  # big_vision's fewshot grid (2^-10 .. 2^19), every other step
EPS = 1e-5  # added to each dimension's std, so that a constant feature does not divide by 0 (big_vision's)


def _targets(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """{-1, +1} targets, one column per class: (n,) -> (n, C)."""
    if labels.ndim != 1:
        raise VitlabError(
            f"labels must be a 1-D tensor of class indices; found shape {tuple(labels.shape)}", arg="labels"
        )
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise VitlabError(
            f"labels must be in 0..{num_classes - 1}; found {int(labels.min())}..{int(labels.max())}", arg="labels"
        )
    y = -torch.ones(len(labels), num_classes, dtype=torch.float64)
    y[torch.arange(len(labels)), labels.long()] = 1.0
    return y


def fit_ridge(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, l2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ridge map from `features` (n, d) to {-1, +1} targets: (W (d, C), b (C,)), float64, in the features' own
    coordinates, so that scores = features @ W + b and the prediction is their argmax.

    The features are standardised per dimension (mean and std of these n) before the penalty l2 * |W|^2 applies,
    and centred targets make the bias unpenalised. l2 = 0 is least squares (the minimum-norm solution when n <= d).
    """
    if features.ndim != 2 or len(features) != len(labels):
        raise VitlabError(
            f"features must be (n, d) with one row per label ({len(labels)}); found shape {tuple(features.shape)}",
            arg="features",
        )
    if not l2 >= 0:
        raise VitlabError(f"l2 must be >= 0; found {l2}", arg="l2")
    x = features.detach().to("cpu", torch.float64)  # (n, d)
    y = _targets(labels.detach().cpu(), num_classes)  # (n, C)
    mu, sd = x.mean(0), x.std(0, correction=0) + EPS  # (d,), (d,)
    xs, y_mean = (x - mu) / sd, y.mean(0)  # (n, d) standardised, (C,)
    yc = y - y_mean  # (n, C)
    n, d = xs.shape
    if l2 == 0:
        w = torch.linalg.lstsq(xs, yc, driver="gelsd").solution  # (d, C): the minimum-norm least-squares map
    elif n >= d:
        w = torch.linalg.solve(xs.T @ xs + l2 * torch.eye(d, dtype=torch.float64), xs.T @ yc)  # (d, C), primal
    else:
        w = xs.T @ torch.linalg.solve(xs @ xs.T + l2 * torch.eye(n, dtype=torch.float64), yc)  # (d, C), dual
    w_orig = w / sd[:, None]  # (d, C): back to the features' coordinates
    return w_orig, y_mean - mu @ w_orig


def predict(features: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The class of each row of `features` (n, d) under the ridge map: (n,)."""
    return (features.detach().to("cpu", torch.float64) @ w + b).argmax(dim=1)


def accuracy(features: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> float:
    return float((predict(features, w, b) == labels.cpu()).double().mean())


def few_shot(labels: torch.Tensor, *, shots: int, draws: int, seed: int) -> list[torch.Tensor]:
    """`draws` index sets into `labels`, each with exactly `shots` images of every class present, drawn without
    replacement by a generator seeded with `seed` (the same seed, the same draws); each set in class order."""
    if shots < 1 or draws < 1:
        raise VitlabError(f"shots and draws must be at least 1; found shots={shots}, draws={draws}", arg="shots")
    labels = labels.detach().cpu()
    classes = torch.unique(labels)
    per_class = [torch.nonzero(labels == c).flatten() for c in classes]
    short = {int(c): len(i) for c, i in zip(classes, per_class) if len(i) < shots}
    if short:
        raise VitlabError(f"shots={shots} per class, but class(es) {short} have fewer images (count)", arg="shots")
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([i[torch.randperm(len(i), generator=g)[:shots]] for i in per_class]) for _ in range(draws)]


def linear_probe(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    val_feats: torch.Tensor,
    val_labels: torch.Tensor,
    test_feats: torch.Tensor,
    test_labels: torch.Tensor,
    shots: Sequence[int] = (1, 5, 10, 25),
    draws: int = 5,
    l2_grid: Sequence[float] = L2_GRID,
    seed: int = 0,
) -> dict[int, dict]:
    """Few-shot linear probe accuracy per shot count: for each k in `shots`, `draws` draws of k training images per
    class (`few_shot`, seed `seed + k`); the ridge strength of `l2_grid` with the best mean accuracy over the draws on
    the held-out `val` features; at it, the accuracy on the `test` features.

    Returns {k: {"l2": chosen, "test_acc": mean over draws, "test_acc_per_draw": [...], "val_acc": {l2: mean}}}.
    """
    if not l2_grid:
        raise VitlabError("l2_grid must name at least one ridge strength; found none", arg="l2_grid")
    num_classes = int(max(train_labels.max(), val_labels.max(), test_labels.max())) + 1
    out = {}
    for k in shots:
        sets = few_shot(train_labels, shots=k, draws=draws, seed=seed + k)
        fits = {l2: [fit_ridge(train_feats[i], train_labels[i], num_classes, l2) for i in sets] for l2 in l2_grid}
        val = {l2: sum(accuracy(val_feats, val_labels, *f) for f in fs) / draws for l2, fs in fits.items()}
        best = max(l2_grid, key=lambda l2: val[l2])  # the first of equals in the grid's order
        per_draw = [accuracy(test_feats, test_labels, *f) for f in fits[best]]
        out[int(k)] = {"l2": best, "test_acc": sum(per_draw) / draws, "test_acc_per_draw": per_draw, "val_acc": val}
    return out


def features(
    model: nn.Module, data: torch.Tensor | Iterable, *, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pre-logit features of `data` (forward_features, then forward_head(pre_logits=True)), in eval mode and without
    gradients: (features (N, F) float32 on the CPU, labels (N,) or None). `data`: preprocessed images (N, C, H, W),
    or a loader of (images, labels) batches. The model is handed back as it came: every module's train/eval mode is
    restored, and no weight or buffer changes (eval mode: no batch-norm statistics are updated)."""
    device = next(model.parameters()).device
    modes = [(m, m.training) for m in model.modules()]
    batches = (
        ((data[i : i + batch_size], None) for i in range(0, len(data), batch_size))
        if isinstance(data, torch.Tensor)
        else data
    )
    feats, labels = [], []
    model.eval()
    try:
        with torch.no_grad():
            for x, y in batches:
                f = model.forward_head(model.forward_features(x.to(device)), pre_logits=True)  # (B, F)
                feats.append(f.float().cpu())
                if y is not None:
                    labels.append(y.cpu())
    finally:
        for m, training in modes:
            m.training = training
    if not feats:
        raise VitlabError("data has no images", arg="data")
    return torch.cat(feats), (torch.cat(labels) if labels else None)


__all__ = ["L2_GRID", "accuracy", "features", "few_shot", "fit_ridge", "linear_probe", "predict"]
