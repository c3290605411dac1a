"""Few-shot linear probes: the ridge map recovers a planted linear class structure, its shrinkage is the ridge's,
few-shot draws are exact and seeded, and `features` hands the model back unchanged."""

from __future__ import annotations

import pytest
import torch

from vitlab.analysis.probe import L2_GRID, accuracy, features, few_shot, fit_ridge, linear_probe
from vitlab.errors import VitlabError
from vitlab.models.factory import create_model


def _planted(n: int, d: int, c: int, seed: int = 0):
    """Features X (n, d), labels, W* (d, c), b* (c,) with X W* + b* exactly the {-1, +1} targets. Every target row
    sums to 2 - c, so an exact map's rows sum to 0 (else X would have a constant direction) and b* sums to 2 - c."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % c  # every class present
    y = -torch.ones(n, c, dtype=torch.float64)
    y[torch.arange(n), labels] = 1
    w_star = torch.randn(d, c, generator=g, dtype=torch.float64)
    w_star -= w_star.mean(1, keepdim=True)  # (d, c), rows summing to 0
    b_star = torch.randn(c, generator=g, dtype=torch.float64)
    b_star += (2 - c) / c - b_star.mean()  # (c,), summing to 2 - c
    r = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3, d, dtype=torch.float64)
    x = r + (y - b_star - r @ w_star) @ torch.linalg.pinv(w_star)  # (n, d): now x @ w_star + b_star == y
    assert torch.allclose(x @ w_star + b_star, y, atol=1e-10)
    return x, labels, w_star, b_star


def test_ridge_recovers_a_planted_linear_map_as_l2_goes_to_0():
    x, labels, w_star, b_star = _planted(200, 16, 4)
    w, b = fit_ridge(x, labels, 4, 0.0)
    assert w.dtype == torch.float64 and w.shape == (16, 4) and b.shape == (4,)
    assert torch.allclose(w, w_star, atol=1e-8) and torch.allclose(b, b_star, atol=1e-8)
    assert accuracy(x, labels, w, b) == 1.0
    errors = [float((fit_ridge(x, labels, 4, l2)[0] - w_star).norm()) for l2 in (1e-8, 1e-4, 1e-1, 10.0, 1e3)]
    assert errors[0] < 1e-7 and all(a < b for a, b in zip(errors, errors[1:]))  # shrinkage grows with l2


def test_ridge_shrinkage_is_the_closed_form():
    # standardised features s: w_s(l2) = (s^T s + l2 I)^-1 s^T s w_s*, the planted map shrunk by the ridge
    x, labels, w_star, _ = _planted(120, 8, 3, seed=1)
    mu, sd = x.mean(0), x.std(0, correction=0) + 1e-5
    s = (x - mu) / sd
    gram = s.T @ s
    for l2 in (0.5, 20.0):
        expected = torch.linalg.solve(gram + l2 * torch.eye(8, dtype=torch.float64), gram @ (sd[:, None] * w_star))
        assert torch.allclose(fit_ridge(x, labels, 3, l2)[0] * sd[:, None], expected, atol=1e-9)


def test_ridge_dual_solve_equals_primal_with_fewer_images_than_dimensions():
    g = torch.Generator().manual_seed(2)
    x, labels = torch.randn(12, 40, generator=g), torch.arange(12) % 4  # n < d: the dual (n x n) system
    for l2 in (1e-3, 1.0, 100.0):
        w, b = fit_ridge(x, labels, 4, l2)
        xd = x.double()
        mu, sd = xd.mean(0), xd.std(0, correction=0) + 1e-5
        s = (xd - mu) / sd
        y = -torch.ones(12, 4, dtype=torch.float64)
        y[torch.arange(12), labels] = 1
        primal = torch.linalg.solve(s.T @ s + l2 * torch.eye(40, dtype=torch.float64), s.T @ (y - y.mean(0)))
        assert torch.allclose(w * sd[:, None], primal, atol=1e-9)
    assert accuracy(x, labels, *fit_ridge(x, labels, 4, 1e-6)) == 1.0  # 12 points in 40-D: interpolated
    w0, _ = fit_ridge(x, labels, 4, 0.0)  # l2 = 0 with n < d: the minimum-norm solution, finite
    assert torch.isfinite(w0).all()


def test_ridge_refuses_bad_input():
    x, labels = torch.randn(10, 3), torch.arange(10) % 2
    with pytest.raises(VitlabError, match="labels must be in 0..1"):
        fit_ridge(x, labels + 1, 2, 1.0)
    with pytest.raises(VitlabError, match="one row per label"):
        fit_ridge(x[:5], labels, 2, 1.0)
    with pytest.raises(VitlabError, match="l2 must be >= 0"):
        fit_ridge(x, labels, 2, -1.0)


def test_few_shot_draws_exactly_k_per_class_reproducibly():
    labels = torch.tensor([0] * 30 + [1] * 12 + [2] * 7)[torch.randperm(49, generator=torch.Generator().manual_seed(0))]
    sets = few_shot(labels, shots=5, draws=4, seed=3)
    assert len(sets) == 4
    for idx in sets:
        assert len(idx) == 15 and len(set(idx.tolist())) == 15
        assert torch.bincount(labels[idx], minlength=3).tolist() == [5, 5, 5]
    assert all(torch.equal(a, b) for a, b in zip(sets, few_shot(labels, shots=5, draws=4, seed=3)))
    assert not all(torch.equal(a, b) for a, b in zip(sets, few_shot(labels, shots=5, draws=4, seed=4)))
    assert len({tuple(s.tolist()) for s in sets}) == 4  # the draws differ from each other
    with pytest.raises(VitlabError, match=r"class\(es\) \{2: 7\}"):
        few_shot(labels, shots=8, draws=1, seed=0)


def _clusters(n_per_class: int, seed: int, d: int = 32, c: int = 5, spread: float = 0.6):
    g = torch.Generator().manual_seed(100)  # the class means are shared by every split
    means = 2 * torch.randn(c, d, generator=g)
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(c).repeat_interleave(n_per_class)
    return means[labels] + spread * torch.randn(len(labels), d, generator=g), labels


def test_linear_probe_chooses_l2_on_val_and_reports_each_draw():
    (tr, ytr), (va, yva), (te, yte) = _clusters(30, 1), _clusters(20, 2), _clusters(40, 3)
    grid = (1e-2, 1.0, 100.0)
    out = linear_probe(tr, ytr, va, yva, te, yte, shots=(1, 5), draws=3, l2_grid=grid, seed=0)
    assert sorted(out) == [1, 5]
    for r in out.values():
        assert r["l2"] == max(grid, key=lambda l2: r["val_acc"][l2])  # chosen on the held-out features
        assert len(r["test_acc_per_draw"]) == 3
        assert r["test_acc"] == pytest.approx(sum(r["test_acc_per_draw"]) / 3)
    assert out[5]["test_acc"] > 0.95 and out[5]["test_acc"] >= out[1]["test_acc"] - 0.02
    again = linear_probe(tr, ytr, va, yva, te, yte, shots=(1, 5), draws=3, l2_grid=grid, seed=0)
    assert again == out  # deterministic
    assert L2_GRID[0] < L2_GRID[-1]


@pytest.mark.parametrize("name", ["vit_mini", "resnet_mini"])
def test_features_leave_the_model_unchanged(name):
    torch.manual_seed(0)
    model = create_model(name, num_classes=3, img_size=32)
    model.train()
    first = next(m for m in model.modules() if m is not model and list(m.children()))
    first.eval()  # a mixed state, as a partly frozen model has: every module's mode must come back
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    f, labels = features(model, x, batch_size=4)  # three batches
    assert labels is None and f.dtype == torch.float32 and not f.requires_grad
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # batch-norm statistics too
    model.eval()
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(x), pre_logits=True)
    assert f.shape == expected.shape and torch.allclose(f, expected, atol=1e-5)
    loader = [(x[:6], torch.tensor([0, 1, 2, 0, 1, 2])), (x[6:], torch.tensor([0, 1, 2, 0]))]
    f2, y2 = features(model, loader)
    assert torch.allclose(f2, f, atol=1e-5) and y2.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
