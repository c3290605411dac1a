"""`vitlab reproduce`: the shapes datasets, the verdict rules on hand-made numbers, and the --quick
report end to end (its structure, claim 1 reproduced, and a second run served from the cache)."""

from __future__ import annotations

import csv
import re

import pytest
import torch

from vitlab.cli import main
from vitlab.data.shapes import ARRANGEMENT_NAMES, POSITION_NAMES, SHAPE_NAMES, make_shapes
from vitlab.experiments.reproduce import (
    EXPERIMENTS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    at_least,
    close,
    combine,
    greater,
    near,
    pe_structure,
)

# ----------------------------------------------------------------------------------------------------
# Shapes


def test_shapes_are_deterministic_nested_and_split():
    a, ya = make_shapes(40, seed=3, img_size=16)
    b, yb = make_shapes(40, seed=3, img_size=16)
    assert torch.equal(a, b) and torch.equal(ya, yb)
    big, ybig = make_shapes(1100, seed=3, img_size=16)  # two generation chunks
    assert torch.equal(big[:40], a) and torch.equal(ybig[:40], ya)  # image i depends on (seed, i) only
    other, _ = make_shapes(40, seed=4, img_size=16)
    val, _ = make_shapes(40, seed=3, img_size=16, split="val")
    assert not torch.allclose(a, other) and not torch.allclose(a, val)
    assert a.shape == (40, 3, 16, 16) and a.dtype == torch.float32
    assert a.min() >= -1 and a.max() <= 1


@pytest.mark.parametrize("task,k", [("shape", len(SHAPE_NAMES)), ("arrangement", len(ARRANGEMENT_NAMES)),
                                    ("position", len(POSITION_NAMES))])
def test_shapes_classes_are_balanced(task, k):
    _, y = make_shapes(2048, seed=0, task=task, img_size=16)  # two full chunks
    counts = torch.bincount(y, minlength=k)
    assert counts.max() - counts.min() <= 2, counts


def test_arrangement_label_matches_where_red_and_blue_are():
    x, y = make_shapes(300, seed=1, task="arrangement", img_size=32, normalize=False, noise=0.0)
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    red = (r > 0.55) & (g < 0.3) & (b < 0.3)  # (n, H, W)
    blue = (b > 0.55) & (r < 0.3) & (g < 0.3)
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")

    def centre(mask):
        w = mask.float()
        n = w.sum(dim=(1, 2)).clamp_min(1)
        return (w * xs).sum(dim=(1, 2)) / n, (w * ys).sum(dim=(1, 2)) / n

    (rx, ry), (bx, by) = centre(red), centre(blue)
    dx, dy = rx - bx, ry - by
    pred = torch.where(dx.abs() > dy.abs(), torch.where(dx < 0, 0, 1), torch.where(dy < 0, 2, 3))
    assert (pred == y).float().mean() > 0.97


def test_position_label_is_the_cell_of_the_shape():
    x, y = make_shapes(200, seed=2, task="position", img_size=30, normalize=False, noise=0.0)
    background = x[:, :, :1, :1]  # the corner pixel: the shape never reaches it
    fg = (x - background).abs().sum(dim=1) > 0.3  # (n, H, W)
    ys, xs = torch.meshgrid(torch.arange(30.0), torch.arange(30.0), indexing="ij")
    n = fg.float().sum(dim=(1, 2)).clamp_min(1)
    cx, cy = (fg * xs).sum(dim=(1, 2)) / n, (fg * ys).sum(dim=(1, 2)) / n
    cell = (cy // 10) * 3 + (cx // 10)  # 3 x 3 cells of 10 px, raster order
    assert (cell == y).float().mean() > 0.97


# ----------------------------------------------------------------------------------------------------
# Verdict rules on hand-made numbers


def test_greater_rule():
    assert greater([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], 0.03).status == REPRODUCED
    # no difference, measured precisely: confidently less than the claimed 3-point advantage
    assert greater([0.80, 0.81, 0.82], [0.80, 0.81, 0.82], 0.03).status == NOT_REPRODUCED
    # a 5-point difference drowned in seed noise
    assert greater([0.70, 0.95, 0.80], [0.60, 0.90, 0.80], 0.0).status == INCONCLUSIVE
    # significant but smaller than the margin, and the interval still reaches the margin
    assert greater([0.82, 0.83, 0.84], [0.80, 0.81, 0.82], 0.03).status == INCONCLUSIVE
    assert greater([0.95], [0.5], 0.0).status == INCONCLUSIVE  # one seed: no error bar, no verdict
    assert greater([1.0, 2.0, 3.0], 0.0, 0.0, unit="px").status == REPRODUCED  # one-sample form


def test_close_at_least_near_and_combine():
    assert close([0.80, 0.81, 0.82], [0.81, 0.82, 0.83], 0.03).status == REPRODUCED
    assert close([0.70, 0.71, 0.72], [0.80, 0.81, 0.82], 0.03).status == NOT_REPRODUCED
    assert close([0.70, 0.80, 0.90], [0.80, 0.90, 1.00], 0.03).status == INCONCLUSIVE
    assert close([0.25, 0.26], [0.25, 0.25], 0.03, floor=0.28).status == INCONCLUSIVE  # equal at chance: says nothing
    assert close([0.95, 0.96], [0.95, 0.95], 0.03, floor=0.28).status == REPRODUCED
    assert at_least([0.96, 0.97], 0.95).status == REPRODUCED
    assert at_least([0.80, 0.81], 0.95).status == NOT_REPRODUCED
    assert near([0.50, 0.52], 0.5, 0.05).status == REPRODUCED
    assert near([0.90, 0.91], 0.5, 0.05).status == NOT_REPRODUCED
    r, n, i = greater([0.9, 0.91], [0.5, 0.51]), greater([0.5, 0.51], [0.9, 0.91]), greater([0.9], [0.5])
    assert combine(r, r).status == REPRODUCED
    assert combine(r, i).status == INCONCLUSIVE
    assert combine(r, i, n).status == NOT_REPRODUCED


def test_pe_structure_separates_2d_from_1d_embeddings():
    from vitlab.models.vit import sincos_2d_embedding

    g = (8, 8)
    pe = torch.nn.functional.normalize(sincos_2d_embedding(g, 64), dim=-1)
    vertical, far = pe_structure(pe @ pe.T, g)
    assert vertical - far > 0.1  # a 2-D embedding: vertical neighbours alike, far positions not
    idx = torch.arange(64.0)[:, None]  # a 1-D embedding of the raster index: vertical neighbours are 8 apart
    pe1 = torch.nn.functional.normalize(torch.cat([torch.sin(idx / 4 ** (k / 8)) for k in range(8)] +
                                                  [torch.cos(idx / 4 ** (k / 8)) for k in range(8)], dim=1), dim=-1)
    v1, f1 = pe_structure(pe1 @ pe1.T, g)
    assert (vertical - far) > (v1 - f1)


# ----------------------------------------------------------------------------------------------------
# The --quick report, end to end (about 3 minutes on 2 CPU cores)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "tmp"
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(out)]) == 0
    return out


def test_quick_report_has_every_claim_with_a_verdict(quick_report):
    md = (quick_report / "report.md").read_text()
    html = (quick_report / "report.html").read_text()
    statuses = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    for e in EXPERIMENTS:
        section = md.split(f"## {e.number}. {e.title}")[1].split("\n## ")[0]
        verdict = re.search(r"\*\*Verdict: (.+?)\.\*\*", section)
        assert verdict and verdict.group(1) in statuses, e.name
        assert "Source:" in section and "**Rule.**" in section and "| " in section  # quote, rule, table
        assert re.search(r"!\[claim \d\]\(figures/.+\.png\)", section)
        assert f"id='claim{e.number}'" in html
        rows = list(csv.reader((quick_report / "results" / f"claim{e.number}_{e.name}.csv").open()))
        assert len(rows) >= 3  # a header and per-seed rows
    assert html.count("data:image/png;base64,") >= len(EXPERIMENTS)  # self-contained: figures embedded
    assert "src='figures/" not in html
    verdicts = {r["name"]: r["verdict"] for r in csv.DictReader((quick_report / "results" / "verdicts.csv").open())}
    assert set(verdicts) == {e.name for e in EXPERIMENTS}
    assert verdicts["x_pos_embed"] == REPRODUCED  # dataset X >= 95%, and chance without position embedding


def test_second_run_reads_the_cache(quick_report, capsys):
    results = sorted((quick_report / "cache" / "runs").glob("*/result.json"))
    stamps = [p.stat().st_mtime_ns for p in results]
    capsys.readouterr()
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(quick_report), "--only", "x_pos_embed,8"]) == 0
    out = capsys.readouterr().out
    assert "0 run(s) trained" in out and "cached" in out
    assert [p.stat().st_mtime_ns for p in results] == stamps  # nothing retrained
    assert sorted((quick_report / "cache" / "runs").glob("*/result.json")) == results
    md = (quick_report / "report.md").read_text()
    assert "## 1." in md and "## 8." in md and "## 2." not in md  # --only selects the report's claims


def test_unknown_experiment_is_a_one_line_error(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--only", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "x_pos_embed" in err and "nope" in err
