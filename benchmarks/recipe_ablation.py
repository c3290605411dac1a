"""Why a short `vitlab train` learned at half the speed of a plain training loop, and the defaults chosen
from it: the from-scratch recipe ablated on Fashion-MNIST, each row next to a plain loop of the same budget.
A benchmark (prints and writes a table), not a test. docs/recipe.md holds its table and what it found.

    python benchmarks/recipe_ablation.py --out runs/recipe_ablation --compare  # vitlab's defaults vs the plain loop
    python benchmarks/recipe_ablation.py --out runs/recipe_ablation  # every row, 2,000 images, 3 and 15 epochs
    python benchmarks/recipe_ablation.py --out runs/recipe_ablation --sizes 1000 10000 --epochs 3 15 50 \\
        --rows plain before defaults

The data: Fashion-MNIST's 60,000 training images, one permutation seeded by 0; its first 1,000 are the
validation images of every run, the next N (1,000, 2,000, 10,000) the training images, so smaller training
sets are inside larger ones. They are written once as image folders (28x28 grey PNGs, `<out>/data/fm<N>/
train|val/<class>/`), which every row reads. The 10,000 test images are never used: recipes are chosen here.

A row is `vitlab train --data <folder> --model vit_mini --epochs E` with its flags (`ROWS`), run in its own
process with `--threads 1 --fast-path off` (the model as built: deterministic), or the plain loop:

    the plain loop     what a user writes instead, in ten lines (`plain_loop` below): the folder read with
                       torchvision's ImageFolder, resized to 32 px (v2.Resize, antialiased) and normalised to
                       [-1, 1]; timm's VisionTransformer with vit_mini's architecture (32 px, patch 4, D 64,
                       4 blocks, 4 heads, MLP 128: the same 142,026 parameters); AdamW lr 1e-3, weight decay
                       0.05, batch 32, torch's OneCycleLR (10% warmup, cosine), no augmentation.

Every cell is the validation accuracy after the last epoch (not the best epoch: the plain loop has none to
pick), on the same 1,000 images. A cell is kept in `<out>/runs/<key>/result.json` and not run again; rows
whose flags come to the same recipe for a run length (the auto defaults) share their runs. Every run is
deterministic: the same command gives the same numbers on one machine; the load of the machine changes
only the time.

Cost on a 2-core AMD EPYC shared with other work, one thread per run, one run at a time (`--jobs 1`): a
3-epoch run of 2,000 images takes about 20 s, a 15-epoch run about 75 s; the table (2,000 images, 3 and 15
epochs, every row) about 40 min; 10,000 images for 15 epochs about 4 min a run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from vitlab.cli import build_parser
from vitlab.cli.train import job_from_args
from vitlab.data.digits import write_digits_folder
from vitlab.data.fashion_mnist import FOLDER_NAMES, load_fashion_mnist

VAL_IMAGES = 1000
SPLIT_SEED = 0  # the permutation of the data; --seed is the runs' (initial weights, order, augmentation)
MODEL = "vit_mini"

# name -> `vitlab train` flags added to the defaults (a function of the epochs where a row depends on them);
# None: the plain loop. Grouped as the table shows them.
ROWS: dict[str, list[str] | None] = {
    "plain": None,
    "defaults": [],
    "before": [
        "--init",
        "trunc_normal",
        "--head-init",
        "0",
        "--warmup-epochs",
        "3",
        "--aug",
        "--crop-scale",
        "0.35",
        "--crop-pct",
        "0.9",
    ],
    # initialisation of the random weights
    "init trunc_normal": ["--init", "trunc_normal"],
    "head zero": ["--head-init", "0"],
    "init trunc_normal, head zero": ["--init", "trunc_normal", "--head-init", "0"],
    # augmentation
    "no aug": ["--no-aug"],
    "aug: flip only": ["--aug", "--crop-scale", "1"],
    "aug: crop 0.8 + flip": ["--aug", "--crop-scale", "0.8"],
    "aug: crop 0.6 + flip": ["--aug", "--crop-scale", "0.6"],
    "aug: crop 0.35 + flip": ["--aug", "--crop-scale", "0.35"],
    "aug: crop 0.35, no flip": ["--aug", "--crop-scale", "0.35", "--no-hflip"],
    # optimisation
    "lr 5e-4": ["--lr", "5e-4"],
    "lr 2e-3": ["--lr", "2e-3"],
    "weight decay 0": ["--weight-decay", "0"],
    "weight decay 0.1": ["--weight-decay", "0.1"],
    "batch 16": ["--batch-size", "16"],
    "batch 64": ["--batch-size", "64"],
    # schedule
    "warmup 0": ["--warmup-epochs", "0"],
    "warmup 3 epochs": ["--warmup-epochs", "3"],
    "cosine to 0.1 x lr": ["--min-lr-ratio", "0.1"],
    # regularisation
    "no clipping": ["--clip-grad", "0"],
    "label smoothing 0.1": ["--smoothing", "0.1"],
    # preprocessing
    "eval crop 0.9": ["--crop-pct", "0.9"],
}
COMPARE = ("plain", "defaults")

# Fine-tuning (`vitlab finetune`, --finetune): the model of the row "defaults" trained on 10,000 Fashion-MNIST
# images for 15 epochs, fine-tuned on the bundled digits (a folder: 1,438 train / 359 val, 32 px; no flips) with
# the fine-tuning preset's defaults and with the flags that gave the defaults before.
FT_PRETRAIN = (10_000, 15)
FT_ROWS: dict[str, list[str]] = {
    "finetune defaults": [],
    "finetune before": ["--warmup-epochs", "1", "--aug", "--crop-scale", "0.35", "--crop-pct", "0.9"],
    "finetune: warmup 1 epoch per stage": ["--warmup-epochs", "1"],
    "finetune: aug crop 0.35": ["--aug", "--crop-scale", "0.35"],
    "finetune: aug crop 0.8": ["--aug", "--crop-scale", "0.8"],
}


# ----------------------------------------------------------------------------------------------------
# The data


def write_folders(root: Path, sizes: list[int], seed: int = SPLIT_SEED) -> dict[int, Path]:
    """One image folder per training-set size: the same 1,000 validation images, nested training images."""
    x = y = None
    folders = {}
    for n in sorted(sizes):
        folder = root / f"fm{n}"
        folders[n] = folder
        if folder.exists():
            continue
        if x is None:
            x, y = load_fashion_mnist(None, train=True)
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".fm{n}."))
        for part, idx in (("val", order[:VAL_IMAGES]), ("train", order[VAL_IMAGES : VAL_IMAGES + n])):
            for name in FOLDER_NAMES:
                (tmp / part / name).mkdir(parents=True)
            for i in idx.tolist():
                Image.fromarray(x[i, 0].numpy(), "L").save(tmp / part / FOLDER_NAMES[int(y[i])] / f"{i:05d}.png")
        os.replace(tmp, folder)
    return folders


# ----------------------------------------------------------------------------------------------------
# The plain loop


def plain_loop(data: Path, epochs: int, seed: int = 0) -> dict:
    """A plain PyTorch loop over timm's VisionTransformer, as a user would write it; returns its accuracies."""
    from timm.models.vision_transformer import VisionTransformer  # timm: a dev extra, the reference only

    torch.manual_seed(seed)
    tf = v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Resize(32), v2.Normalize([0.5] * 3, [0.5] * 3)]
    )
    xt, yt = zip(*ImageFolder(str(data / "train"), transform=tf))  # decoded once: 28x28 grey -> (3, 32, 32)
    xv, yv = zip(*ImageFolder(str(data / "val"), transform=tf))
    xt, yt, xv, yv = torch.stack(xt), torch.tensor(yt), torch.stack(xv), torch.tensor(yv)
    model = VisionTransformer(
        img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batch, order_rng = 32, torch.Generator().manual_seed(seed)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=1e-3, total_steps=epochs * math.ceil(len(yt) / batch), pct_start=0.1
    )
    accs = []
    for _ in range(epochs):
        model.train()
        for b in torch.randperm(len(yt), generator=order_rng).split(batch):
            loss = F.cross_entropy(model(xt[b]), yt[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            accs.append(
                sum((model(x).argmax(-1) == y).sum().item() for x, y in zip(xv.split(500), yv.split(500))) / len(yv)
            )
    return {
        "val_acc": accs[-1],
        "best_val_acc": max(accs),
        "curve": accs,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


# ----------------------------------------------------------------------------------------------------
# The runs


def train_args(data: Path, epochs: int, flags: list[str], seed: int, checkpoint: Path | None = None) -> list[str]:
    source = ["finetune", "--checkpoint", str(checkpoint), "--no-hflip"] if checkpoint else ["train", "--model", MODEL]
    return [
        *source,
        "--data",
        str(data),
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--threads",
        "1",
        "--fast-path",
        "off",
        *flags,
    ]


def run_key(data: Path, epochs: int, flags: list[str] | None, seed: int, checkpoint: Path | None = None) -> str:
    """The cell's cache key: the recipe and job a row's flags come to for this run length (so rows that
    resolve to the same run share it), or the plain loop's budget."""
    if flags is None:
        return f"plain_{data.name}_e{epochs}_s{seed}"
    args = build_parser().parse_args(train_args(data, epochs, flags, seed, checkpoint) + ["--out", "x"])
    job = job_from_args(args)
    fields = job.recipe.resolve(img_size=32, flips=True).to_dict()
    fields.update(crop_pct=job.crop_pct, data=data.name, checkpoint=str(checkpoint))
    text = json.dumps(fields, sort_keys=True)
    return f"vitlab_{data.name}_e{epochs}_s{seed}_" + hashlib.sha256(text.encode()).hexdigest()[:12]


def run_cell(
    out: Path, key: str, data: Path, epochs: int, flags: list[str] | None, seed: int, checkpoint: Path | None = None
) -> dict:
    folder = out / "runs" / key
    result_file = folder / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    t0 = time.perf_counter()
    if flags is None:
        cmd = [
            sys.executable,
            __file__,
            "--plain",
            str(data),
            "--epochs",
            str(epochs),
            "--seed",
            str(seed),
            "--out",
            str(folder),
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "vitlab",
            *train_args(data, epochs, flags, seed, checkpoint),
            "--out",
            str(folder / "run"),
        ]
    finished = folder / ("plain.json" if flags is None else "run/summary.json")  # written last by a complete run
    ran = not finished.exists()
    if ran:  # (a run finished after its result.json was lost is read, not run again)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(folder / "log.txt", "w") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        if code != 0:
            raise SystemExit(f"failed ({code}): {' '.join(cmd)}; see {folder / 'log.txt'}")
    if flags is None:
        result = json.loads((folder / "plain.json").read_text())
    else:
        summary = json.loads((folder / "run" / "summary.json").read_text())
        header, *lines = (folder / "run" / "metrics.csv").read_text().splitlines()
        curve = [float(line.split(",")[header.split(",").index("val_acc")]) for line in lines]
        result = {
            "val_acc": summary["final"]["val_acc"],
            "best_val_acc": summary["best"]["val_acc"],
            "curve": curve,
            "recipe": summary["recipe"],
            "time_s": summary["time_s"],
        }
    shown = ["vitlab", *cmd[3:]] if flags is not None else ["python", "benchmarks/recipe_ablation.py", *cmd[2:]]
    result.update(command=" ".join(shown), wall_s=time.perf_counter() - t0 if ran else result.get("time_s", 0.0))
    result_file.write_text(json.dumps(result, indent=1))
    return result


def run_grid(out: Path, cells: dict, seed: int, jobs: int, where) -> dict:
    """{(row, images, epochs): result} for cells {(row, images, epochs): (data, epochs, flags, checkpoint)}, `jobs`
    runs at a time; rows that come to the same run share it, and a finished run is read back."""
    keys = {cell: run_key(data, e, flags, seed, ckpt) for cell, (data, e, flags, ckpt) in cells.items()}
    first = {}  # key -> the first cell that needs it
    for cell, key in keys.items():
        first.setdefault(key, cell)
    done = {}

    def one(key):
        cell = first[key]
        data, e, flags, ckpt = cells[cell]
        done[key] = r = run_cell(out, key, data, e, flags, seed, ckpt)
        same = [c[0] for c, k in keys.items() if k == key]
        print(
            f"{' = '.join(same):<40} {where(cell[1], e)}: val acc {100 * r['val_acc']:.1f}%  ({r['wall_s']:.0f} s)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, first))
    return {cell: done[key] for cell, key in keys.items()}


def table(results: dict, rows: list[str], columns: list[tuple[int, int]]) -> str:
    head = "| row | " + " | ".join(f"{n // 1000}k, {e} ep" if n else f"digits, {e} ep" for n, e in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        cells = []
        for n, e in columns:
            r = results.get((row, n, e))
            cells.append("" if r is None else f"{100 * r['val_acc']:.1f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/recipe_ablation", help="folder for the data, the runs and table.md")
    p.add_argument("--sizes", type=int, nargs="+", default=[2000], help="training images (default 2000)")
    p.add_argument("--epochs", type=int, nargs="+", default=[3, 15], help="run lengths (default 3 15)")
    p.add_argument("--rows", nargs="+", default=None, help=f"rows to run (default all): {', '.join(ROWS)}")
    p.add_argument(
        "--compare", action="store_true", help="only the rows plain and defaults (the criterion of docs/recipe.md)"
    )
    p.add_argument(
        "--finetune",
        action="store_true",
        help="the fine-tuning rows instead (FT_ROWS), on the digits, "
        "from the row defaults' run on 10,000 images for 15 epochs (run first if missing)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of every run: initial weights, order, augmentation (default 0; the data's split is always the same)",
    )
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--plain", metavar="DIR", help=argparse.SUPPRESS)  # internal: one plain-loop run
    args = p.parse_args()
    if args.plain:
        torch.set_num_threads(1)
        result = plain_loop(Path(args.plain), args.epochs[0], args.seed)
        Path(args.out, "plain.json").write_text(json.dumps(result, indent=1))
        return
    out = Path(args.out)
    (out / "data").mkdir(parents=True, exist_ok=True)
    if args.finetune:
        finetune(out, args)
        return
    rows = list(COMPARE) if args.compare else (args.rows or list(ROWS))
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; known: {list(ROWS)}")
    folders = write_folders(out / "data", args.sizes)
    cells = {(row, n, e): (folders[n], e, ROWS[row], None) for n in args.sizes for e in args.epochs for row in rows}
    results = run_grid(out, cells, args.seed, args.jobs, lambda n, e: f"{n:>6} images {e:>3} epochs")
    text = table(results, rows, [(n, e) for n in args.sizes for e in args.epochs])
    print(
        f"\nvalidation accuracy (%) after the last epoch, {VAL_IMAGES:,} held-out training images; "
        f"{cpu_name()}\n\n{text}"
    )
    (out / "table.md").write_text(text + "\n")


def finetune(out: Path, args) -> None:
    """The fine-tuning rows: from the defaults' model of FT_PRETRAIN, on the digits folder."""
    n, e = FT_PRETRAIN
    pre = write_folders(out / "data", [n])[n]
    key = run_key(pre, e, ROWS["defaults"], args.seed)
    r = run_cell(out, key, pre, e, ROWS["defaults"], args.seed)
    print(f"pretrained: defaults, {n} images, {e} epochs: val acc {100 * r['val_acc']:.1f}%", flush=True)
    checkpoint = out / "runs" / key / "run"
    digits = out / "data" / "digits"
    if not digits.exists():
        write_digits_folder(digits, size=32, seed=SPLIT_SEED)
    cells = {(row, 0, ep): (digits, ep, FT_ROWS[row], checkpoint) for ep in args.epochs for row in FT_ROWS}
    results = run_grid(out, cells, args.seed, args.jobs, lambda _, e: f"digits {e:>3} epochs")
    text = table(results, list(FT_ROWS), [(0, ep) for ep in args.epochs])
    print(
        f"\nfine-tuning on the digits: validation accuracy (%) after the last epoch, 359 images; {cpu_name()}\n\n{text}"
    )
    (out / "table_finetune.md").write_text(text + "\n")


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")]
        if info.exists()
        else []
    )
    return names[0] if names else "unknown CPU"


if __name__ == "__main__":
    main()
