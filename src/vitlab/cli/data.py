"""`vitlab data digits --out DIR` and `vitlab data fashion-mnist --out DIR`: a bundled dataset written as an
image folder; `vitlab data scan DIR`: what `vitlab finetune --data DIR` would see (images per class, skipped files).

    vitlab data digits --out runs/digits --size 32    # ~1 s; 1438 train / 359 val PNGs, 10 classes
    vitlab data fashion-mnist --out runs/fashion      # 60,000 train / 10,000 val 28x28 PNGs, 10 classes
    vitlab finetune --data runs/digits --model vit_mini --no-hflip ...
"""

from __future__ import annotations

import sys

from vitlab.cli._help import example
from vitlab.options import DEFAULT_VAL_SPLIT

EXAMPLE = "vitlab data digits --out runs/digits"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "data",
        help=summary,
        epilog=example(EXAMPLE),
        description="Datasets as image folders: `digits` writes scikit-learn's bundled 8x8 digits (1,797 real "
        "images, 10 classes, no download) as DIR/train/<digit>/*.png and DIR/val/<digit>/*.png; `fashion-mnist` "
        "writes Fashion-MNIST (60,000 + 10,000 grey 28x28 photos) as DIR/train/<class>/*.png and "
        "DIR/val/<class>/*.png; `scan` checks a folder the way `vitlab finetune --data` will.",
    )
    sub = p.add_subparsers(dest="data_command", metavar="WHAT", parser_class=type(p))
    d = sub.add_parser(
        "digits",
        help="write the bundled digits as an image folder",
        epilog=example(EXAMPLE),
        description="Write scikit-learn's 1,797 digits, upsampled to --size, as a train/val image folder.",
    )
    d.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="folder to write: new, empty, or its own earlier output (replaced whole)",
    )
    d.add_argument("--size", type=int, default=32, metavar="PX", help="image side in pixels (>= 8; default 32)")
    d.add_argument(
        "--val-split",
        type=float,
        default=DEFAULT_VAL_SPLIT,
        metavar="F",
        help="fraction of each class written to val/ (seeded, stratified; default 0.2)",
    )
    d.add_argument(
        "--per-class",
        type=int,
        default=None,
        metavar="N",
        help="keep at most N images per class (for quick tests; default all, ~180)",
    )
    d.add_argument("--seed", type=int, default=0, help="seed of the train/val split (default 0)")
    d.set_defaults(func=run_digits)
    f = sub.add_parser(
        "fashion-mnist",
        help="write Fashion-MNIST as an image folder",
        epilog=example("vitlab data fashion-mnist --train-size 2000 --out runs/fashion"),
        description="Write Fashion-MNIST as a train/val image folder: its 60,000 training images (or a "
        "seeded, nested subset of --train-size) in train/, its 10,000 test images in val/; one class folder "
        "each, named by its label first (0_tshirt_top .. 9_ankle_boot), so their sorted order is the label order.",
    )
    f.add_argument("--out", required=True, metavar="DIR", help="new folder to write (must not exist or be empty)")
    f.add_argument(
        "--root",
        metavar="DIR",
        help="the folder with Fashion-MNIST's idx files (.gz or not; default: "
        "$VITLAB_DATA, /usr/share/datasets/fashion-mnist, an earlier download, else a download; a --root serves "
        "this command only)",
    )
    f.add_argument(
        "--train-size",
        type=int,
        default=None,
        metavar="N",
        help="write N training images: the first N of one permutation seeded by --seed (default: all 60,000)",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the --train-size subset (default 0)")
    f.set_defaults(func=run_fashion)
    s = sub.add_parser(
        "scan",
        help="images per class and the files a run would skip",
        epilog=example("vitlab data scan runs/digits"),
        description="Scan an image folder (DIR/train/<class>, DIR/val/<class>, or DIR/<class>) "
        "and print images per class and any skipped files.",
    )
    s.add_argument("data", metavar="DIR", help="the image folder")
    s.add_argument(
        "--val-split",
        type=float,
        default=None,
        metavar="F",
        help="validation fraction for a one-folder layout (default 0.2)",
    )
    s.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    s.set_defaults(func=run_scan)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_digits(args) -> int:
    from vitlab.data.digits import write_digits_folder

    counts = write_digits_folder(
        args.out, size=args.size, val_split=args.val_split, seed=args.seed, per_class=args.per_class
    )
    print(
        f"wrote {counts['train']} train and {counts['val']} val images ({args.size}x{args.size} PNG, 10 classes) "
        f"to {args.out}/train/<digit>/ and {args.out}/val/<digit>/"
    )
    return 0


def run_fashion(args) -> int:
    from vitlab.data.fashion_mnist import write_fashion_mnist_folder

    counts = write_fashion_mnist_folder(args.out, root=args.root, train_size=args.train_size, seed=args.seed)
    print(
        f"wrote {counts['train']:,} train and {counts['val']:,} val images (28x28 grey PNG, 10 classes) "
        f"to {args.out}/train/<class>/ and {args.out}/val/<class>/"
    )
    return 0


def run_scan(args) -> int:
    from vitlab.data.folder import scan_folder

    scan = scan_folder(args.data, val_split=args.val_split, seed=args.seed, cache_mb=0, progress=sys.stderr.isatty())
    if scan.warning():
        print(scan.warning(), file=sys.stderr)
    print(scan.report())
    return 0
