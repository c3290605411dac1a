"""The v2 verdicts of a report from its per-seed CSV files alone (`results/claim*.csv`), without its run cache: the
claims' own `Rule` objects applied to the numbers the report wrote, every part of all eleven claims (the probe parts
of claims 2 and 3 from their probe columns). A report written before a CSV had a column is read as it can be: the v1
report's have no probe columns (those parts are left out) and no claim 8 similarities (read from its table in
report.md), and no claims 10 and 11.

    PYTHONPATH=src python -m vitlab.experiments.reproduce.recompute docs/reproduce
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.claims import (
    claim1_x_pos_embed,
    claim2_pos_embed,
    claim3_cls_vs_gap,
    claim4_patch_size,
    claim5_data_scale,
    claim6_pretrain,
    claim7_hybrid,
    claim8_attention,
    claim9_recipe,
    claim10_compute,
    claim11_resolution,
)
from vitlab.experiments.reproduce.verdicts import NOT_REPRODUCED, REPRODUCED, Verdict, combine, log_error_ratio, stats


def _rows(folder: Path, name: str) -> list[dict]:
    path = folder / "results" / name
    if not path.is_file():
        raise VitlabError(f"{path}: no such file; expected a report folder with results/claim*.csv")
    return list(csv.DictReader(path.open()))


def _by(rows: list[dict], *keys: str) -> dict[tuple, list[float]]:
    """{(the keys' values): per-seed val_acc in seed order}."""
    out: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append((int(r["seed"]), float(r["val_acc"])))
    return {k: [a for _, a in sorted(v)] for k, v in out.items()}


def claim1(folder: Path) -> Verdict:
    acc = {k[0]: v for k, v in _by(_rows(folder, "claim1_x_pos_embed.csv"), "pos_embed").items()}
    m = claim1_x_pos_embed
    return combine(
        m.LEARNED.decide(acc["learned"], what="val acc, learned 1-D"), m.NONE.decide(acc["none"], what="val acc, none")
    )


def _probe_by(rows: list[dict], key: str) -> dict[str, list[float]] | None:
    """{arm: per-seed 5-shot probe accuracy in seed order}, or None where the CSV has no probe column (v1 reports)."""
    column = next((c for c in rows[0] if c.startswith("probe_")), None)
    if column is None:
        return None
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        out[r[key]].append((int(r["seed"]), float(r[column])))
    return {k: [a for _, a in sorted(v)] for k, v in out.items()}


def claim2(folder: Path) -> Verdict:
    rows = _rows(folder, "claim2_pos_embed.csv")
    acc = {k[0]: v for k, v in _by(rows, "pos_embed").items()}
    m = claim2_pos_embed
    test = m.decide(acc, "test acc", m.BEATS_NONE, m.KINDS_CLOSE)
    probe = _probe_by(rows, "pos_embed")
    return test if probe is None else combine(test, m.decide(probe, "probe", m.PROBE_BEATS_NONE, m.PROBE_KINDS_CLOSE))


def claim3(folder: Path) -> Verdict:
    rows, pe_rows = _rows(folder, "claim3_cls_vs_gap.csv"), _rows(folder, "claim2_pos_embed.csv")
    acc = {k[0]: v for k, v in _by(rows, "pool").items()}
    pe = {k[0]: v for k, v in _by(pe_rows, "pos_embed").items()}
    m, effect = claim3_cls_vs_gap, claim2_pos_embed.position_effect
    test = m.SAME.scaled(effect(pe)).decide(acc["cls"], acc["mean"], what="test acc: class token - GAP")
    probe, pe_probe = _probe_by(rows, "pool"), _probe_by(pe_rows, "pos_embed")
    if probe is None or pe_probe is None:
        return test
    close = m.PROBE_SAME.scaled(effect(pe_probe))
    return combine(test, close.decide(probe["cls"], probe["mean"], what="probe: class token - GAP"))


def claim4(folder: Path) -> Verdict:
    rows = _rows(folder, "claim4_patch_size.csv")
    acc = {int(k[0]): v for k, v in _by(rows, "patch_size").items()}
    count = {int(r["patch_size"]): (int(r["seq_len"]), int(r["flops"])) for r in rows}
    P = claim4_patch_size.PATCHES
    halvings = list(zip(P, P[1:]))
    ok = all(count[b][0] > count[a][0] and count[b][1] > count[a][1] for a, b in halvings)
    cost = Verdict(REPRODUCED if ok else NOT_REPRODUCED, "tokens and FLOPs " + ("rise" if ok else "do not rise"))
    rule = claim4_patch_size.SMALLER_IS_BETTER
    return combine(cost, *[rule.decide(acc[b], acc[a], what=f"acc(P={b}) - acc(P={a})") for a, b in halvings])


def claim5(folder: Path) -> Verdict:
    acc = {(k[0], int(k[1])): v for k, v in _by(_rows(folder, "claim5_data_scale.csv"), "model", "n_train").items()}
    ns = sorted({n for _, n in acc})
    small, large = ns[0], ns[-1]
    cnn, vit = claim5_data_scale.CNN, claim5_data_scale.VIT
    k = len(acc[(vit, large)])
    ratio = {n: log_error_ratio(acc[(vit, n)][:k], acc[(cnn, n)][:k]) for n in (small, large)}
    m = claim5_data_scale
    return combine(
        m.CNN_WINS_SMALL.decide(acc[(cnn, small)], acc[(vit, small)], what=f"CNN - ViT at N={small:,}"),
        m.GAP_SHRINKS.decide(ratio[small], ratio[large], what="log error ratio, smallest N - full N"),
    )


def claim6(folder: Path) -> Verdict:
    rows = _rows(folder, "claim6_pretrain.csv")
    held = defaultdict(list)
    for r in rows:
        held[(r["arm"], r["lr"])].append(float(r["held_out_acc"]))
    best = {a: max((lr for arm, lr in held if arm == a), key=lambda lr: stats(held[(a, lr)])[0]) for a, _ in held}
    acc = _by(rows, "arm", "lr")
    ft, sc = acc[("fine-tuned", best["fine-tuned"])], acc[("from scratch", best["from scratch"])]
    return claim6_pretrain.FINE_TUNED_WINS.decide(ft, sc, what="fine-tuned - from scratch")


def claim7(folder: Path) -> Verdict:
    acc = _by(_rows(folder, "claim7_hybrid.csv"), "n_train", "model")
    vit, hyb = claim7_hybrid.ARMS
    sizes = sorted({n for n, _ in acc}, key=int)
    rule = claim7_hybrid.HYBRID_WINS
    return combine(*[rule.decide(acc[(n, hyb)], acc[(n, vit)], what=f"hybrid - ViT at N={n}") for n in sizes])


def claim8(folder: Path) -> Verdict:
    per: dict[int, dict[int, float]] = defaultdict(dict)
    for r in _rows(folder, "claim8_attention.csv"):
        per[int(r["seed"])][int(r["layer"])] = float(r["mean_distance_px"])
    rise = [d[max(d)] - d[min(d)] for _, d in sorted(per.items())]
    rows = _rows(folder, "claim8_attention.csv")
    if "pe_vertical_cos" in rows[0]:  # the position-embedding similarities, per seed
        pe = {int(r["seed"]): float(r["pe_vertical_cos"]) - float(r["pe_far_cos"]) for r in rows}
        locality = [d for _, d in sorted(pe.items())]
    else:  # a report before they were kept in the CSV: the last two columns of claim 8's table, one row per seed
        section = (folder / "report.md").read_text().split("## 8. ")[1].split("\n## ")[0]
        locality = [
            float(m.group(2)) - float(m.group(3))
            for m in re.finditer(r"^\| (\d+) \|.*\| ([0-9.-]+) \| ([0-9.-]+) \|$", section, flags=re.M)
        ]
    m8 = claim8_attention
    return combine(
        m8.RISES.decide(rise, what="last layer - first layer (px)"),
        m8.LOCAL.decide(locality, what="vertical neighbours - far (cosine)"),
    )


def claim9(folder: Path) -> Verdict:
    acc = {
        (int(k[0]), k[1], k[2] == "True"): v
        for k, v in _by(_rows(folder, "claim9_recipe.csv"), "n_train", "model", "recipe").items()
    }
    sizes = sorted({n for n, _, _ in acc})
    small, full = sizes[0], sizes[-1]
    vit, cnn = claim9_recipe.VIT, claim9_recipe.CNN

    def gain(n, m):
        return [b - a for a, b in zip(acc[(n, m, False)], acc[(n, m, True)])]

    m9 = claim9_recipe
    return combine(
        m9.HELPS_VIT.decide(acc[(small, vit, True)], acc[(small, vit, False)], what="ViT with - without"),
        m9.HELPS_VIT_MORE.decide(gain(small, vit), gain(small, cnn), what="ViT's gain - CNN's gain"),
        m9.HELPS_LESS_LATER.decide(gain(small, vit), gain(full, vit), what="ViT's gain, smaller N - full N"),
    )


def claim10(folder: Path) -> Verdict:
    per: dict[str, dict] = {}
    for r in _rows(folder, "claim10_compute.csv"):
        p = per.setdefault(r["model"], {"family": r["family"], "flops": float(r["train_flops"]), "acc": []})
        p["acc"].append((int(r["seed"]), float(r["val_acc"])))
        p["params"] = int(r["params"])
    m = claim10_compute
    points = [
        m.Point(label, p["family"], p["flops"], [a for _, a in sorted(p["acc"])], p["params"])
        for label, p in per.items()
    ]
    return m.verdict_of(points)


def claim11(folder: Path) -> Verdict:
    acc = {k[0]: v for k, v in _by(_rows(folder, "claim11_resolution.csv"), "arm").items()}
    return claim11_resolution.verdict_of(acc)


CLAIMS = {
    1: claim1, 2: claim2, 3: claim3, 4: claim4, 5: claim5, 6: claim6, 7: claim7, 8: claim8, 9: claim9, 10: claim10,
    11: claim11,
}  # fmt: skip


_NAMES = {10: "compute", 11: "resolution"}


def recompute(folder: str | Path) -> dict[int, Verdict]:
    """{claim: its v2 verdict from the report folder's CSV files}: every part, the probe parts of claims 2 and 3 where
    the CSVs have the probe column (a v1 report's do not: the test-accuracy part alone); claims 10 and 11 where the
    folder has their CSVs."""
    folder = Path(folder)
    return {
        n: f(folder)
        for n, f in CLAIMS.items()
        if n <= 9 or (folder / "results" / f"claim{n}_{_NAMES[n]}.csv").is_file()
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else "docs/reproduce")
    v1 = {int(r["claim"]): r["verdict"] for r in _rows(folder, "verdicts.csv")}
    print("| # | v1 (the report's) | v2 (recomputed) | v2's detail |")
    print("|---|---|---|---|")
    for n, v in recompute(folder).items():
        print(f"| {n} | {v1.get(n, '-')} | {v.status} | {v.detail} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
