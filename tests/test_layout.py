"""The shape of the code: no import cycle among vitlab's modules, no function-local import of one of
them but in the command line's (vitlab.cli imports the library inside the functions that act, so that a parser
and its `--help` load no torch; nothing below imports vitlab.cli, so such an import hides no cycle); every
command shares the model-source flags with the same meaning and messages; and every command works from a working
directory with relative paths, `~`, and through a symlinked folder."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.cli import build_parser, main

SRC = Path(vitlab.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = ("vitlab",) + f.relative_to(SRC).with_suffix("").parts
        out[".".join(parts).removesuffix(".__init__")] = f
    return out


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(imported vitlab module, whether the import is inside a function or class)."""
    found = []

    def visit(node, nested):
        nonlocal found
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if (
                isinstance(child, ast.ImportFrom)
                and child.module
                and not child.level
                and child.module.startswith("vitlab")
            ):
                found += [(f"{child.module}.{a.name}", inner) for a in child.names] + [(child.module, inner)]
            elif isinstance(child, ast.Import):
                found += [(a.name, inner) for a in child.names if a.name.startswith("vitlab")]
            visit(child, inner)

    visit(tree, False)
    return found


def test_no_import_cycle_and_no_function_local_import_of_a_vitlab_module():
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    local = []
    for m, f in mods.items():
        for target, nested in _imports(ast.parse(f.read_text())):
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            if target not in mods or target == m:
                continue
            if nested and not m.startswith("vitlab.cli."):
                local.append(f"{m} imports {target} inside a function")
            if mods[target].name != "__init__.py":  # a package's __init__ only gathers names; its modules count
                edges[m].add(target)
    assert not local, local
    cycles = []

    def walk(node, path, done):
        for nxt in edges[node]:
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in done:
                done.add(nxt)
                walk(nxt, path + [nxt], done)

    for m in mods:
        walk(m, [m], set())
    assert not cycles, sorted(set(cycles))[:5]
    assert len(mods) > 40  # the walk really saw the package


# The layers of docs/architecture.md, bottom first: a module may import its own layer and the layers below.
LAYERS = [
    ("vitlab.errors", "vitlab.options", "vitlab.fileio", "vitlab.runtime"),
    (
        "vitlab.models.vit",
        "vitlab.models.cnn",
        "vitlab.models.registry",
        "vitlab.models.pretrained_cfg",
        "vitlab.models.size",
    ),
    ("vitlab.weights",),
    ("vitlab.models.factory", "vitlab.models"),
    ("vitlab.data",),
    ("vitlab.speed",),
    ("vitlab.inference", "vitlab.analysis"),
    ("vitlab.train",),
    ("vitlab.bench",),
    ("vitlab.experiments",),
    ("vitlab.serve",),
    ("vitlab.cli", "vitlab.__main__", "vitlab"),
]


def _layer(module: str) -> int:
    """The layer of `module`: that of the longest prefix named in LAYERS."""
    best = max(
        (
            (len(prefix), i)
            for i, layer in enumerate(LAYERS)
            for prefix in layer
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer of LAYERS: add it where docs/architecture.md puts it"
    return best[1]


def test_every_module_imports_only_its_own_layer_and_the_layers_below():
    up = []
    for m, f in _modules().items():
        for target, _ in _imports(ast.parse(f.read_text())):
            while target not in _modules() and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != "vitlab" and target in _modules() and _layer(target) > _layer(m):
                up.append(f"{m} (layer {_layer(m)}) imports {target} (layer {_layer(target)})")
    assert not up, sorted(set(up))
    assert _layer("vitlab.speed.fastpath") < _layer("vitlab.train.engine") < _layer("vitlab.bench")


# ----------------------------------------------------------------------------------------------------
# Only the factory builds models: no module outside models/ calls a model class's constructor


def _model_classes() -> set[str]:
    """The nn.Module classes models/ defines, read from its modules' syntax trees: a class whose base is
    one of torch's modules (nn.Module, nn.Sequential, ...) or one of these classes."""
    bases = {}
    for f in (SRC / "models").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b) for b in node.bases]
    found: set[str] = set()
    while True:
        more = {
            name
            for name, of in bases.items()
            if name not in found and any(b.startswith(("nn.", "torch.nn.")) or b in found for b in of)
        }
        if not more:
            return found
        found |= more


def _constructor_calls(source: str, classes: set[str]) -> list[str]:
    """Each call of a class in `classes` in `source`, by name or through a module (`vit.VisionTransformer(`),
    as "line N: what was called"; a mention without a call (isinstance, an annotation) is not one."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in classes:
                calls.append(f"line {node.lineno}: {ast.unparse(func)}(")
    return sorted(calls)


def test_the_constructor_check_finds_a_model_built_by_name_or_through_its_module():
    source = (
        "import torch\n"
        "from vitlab.models import vit\n"
        "from vitlab.models.vit import VisionTransformer, ViTConfig\n"
        "def count(cfg: ViTConfig) -> int:\n"
        "    with torch.device('meta'):\n"
        "        model = VisionTransformer(cfg)\n"
        "    assert isinstance(model, VisionTransformer)\n"
        "    return vit.VisionTransformer(ViTConfig()).num_classes\n"
    )
    assert _constructor_calls(source, {"VisionTransformer"}) == [
        "line 6: VisionTransformer(",
        "line 8: vit.VisionTransformer(",
    ]
    assert _constructor_calls(source, {"ResNetMini"}) == []


def test_model_classes_are_built_only_in_models():
    classes = _model_classes()
    # the models, their layers; not the configs (dataclasses, built everywhere)
    assert {"VisionTransformer", "ResNetMini", "ConvStem", "PatchEmbed", "Block"} <= classes, sorted(classes)
    assert not {"ViTConfig", "ResNetConfig", "PretrainedCfg"} & classes
    models = SRC / "models"
    built = [
        f"{f.relative_to(SRC.parent)} {call}"
        for f in sorted(SRC.rglob("*.py"))
        if models not in f.parents
        for call in _constructor_calls(f.read_text(), classes)
    ]
    assert not built, f"models are built by vitlab.models.factory (create_model, build_on_meta) only: {built}"


MODEL_COMMANDS = {  # command -> (the other arguments it needs, its rule for the weights)
    "predict": (["x.png"], "required"),
    "export": (["--out", "m.onnx"], "required"),
    "attention": (["x.png", "--out", "o"], "optional"),
    "inspect": (["--out", "o"], "optional"),
    "finetune": (["--data", "d", "--out", "o"], "optional"),
    "train": (["--data", "d", "--out", "o"], "none"),
}
NO_MODEL = "--model is required: name one of the models `vitlab info` lists, or give weights"


def test_every_command_shares_the_model_source_flags():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    helps = {}
    for command, (_, rule) in MODEL_COMMANDS.items():
        actions = {a.dest: a for a in subparsers[command]._actions}
        assert {"model", "img_size"} <= set(actions), command
        assert ("pretrained" in actions and "checkpoint" in actions) == (rule != "none"), command
        for dest in ("model", "pretrained", "checkpoint", "img_size"):
            if dest in actions:
                helps.setdefault(dest, set()).add(actions[dest].help)
    assert all(len(texts) == 1 for texts in helps.values()), helps  # declared once, the same words everywhere


@pytest.mark.parametrize("command", [c for c, (_, rule) in MODEL_COMMANDS.items() if rule != "none"])
def test_the_same_source_mistakes_get_the_same_messages(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "digits", "--out", "d", "--size", "16", "--per-class", "6"]) == 0
    next(Path("d/train/3").iterdir()).rename("x.png")
    capsys.readouterr()
    args, rule = MODEL_COMMANDS[command]
    assert main([command, *args, "--pretrained", "a.safetensors", "--checkpoint", "run"]) == 2
    assert "argument --checkpoint: not allowed with argument --pretrained" in capsys.readouterr().err
    code = main([command, *args])  # no model at all
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert ("give the weights with --pretrained" if rule == "required" else NO_MODEL) in err, err
    missing = tmp_path / "no_run"
    assert main([command, *args, "--model", "vit_mini", "--checkpoint", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --checkpoint {missing} does not exist")
    assert not Path("o").exists()  # a refusal leaves no output behind


def test_commands_work_with_relative_paths_home_and_a_symlinked_folder(tmp_path, monkeypatch, capsys):
    """A new user types relative paths: make a folder, train on it through a symlink, fine-tune, then
    predict, look at attention, inspect, export and scan, all from the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    torch.set_num_threads(1)
    assert main(["data", "digits", "--out", "digits", "--size", "16", "--per-class", "10"]) == 0
    Path("link").symlink_to("digits", target_is_directory=True)
    small = ["--img-size", "16", "--epochs", "1", "--batch-size", "16", "--device", "cpu", "--no-hflip"]
    assert main(["train", "--data", "link", "--model", "vit_mini", *small, "--out", "runs/scratch"]) == 0
    assert (
        main(
            [
                "finetune",
                "--data",
                "digits",
                "--checkpoint",
                "runs/scratch",
                "--freeze-epochs",
                "0",
                *small,
                "--out",
                "~/runs/ft",
            ]
        )
        == 0
    )
    assert (tmp_path / "home" / "runs" / "ft" / "best.json").is_file()
    assert (
        main(["train", "--data", "link", "--out", "runs/x"]) == 2 and NO_MODEL in capsys.readouterr().err
    )  # `~` is the user's home, not a folder named ~
    summary = json.loads((tmp_path / "home/runs/ft/summary.json").read_text())
    assert summary["images"]["train"] == 80 and summary["data"] == str(tmp_path / "digits")
    image = next(Path("link/val/3").iterdir())
    assert main(["predict", str(image), "--checkpoint", "~/runs/ft/best.json", "--topk", "2"]) == 0
    assert main(["attention", str(image), "--checkpoint", "~/runs/ft", "--out", "out/attn"]) == 0
    assert (
        main(
            [
                "inspect",
                "--checkpoint",
                "runs/scratch/last.json",
                "--images",
                "link/val/3",
                "--max-images",
                "2",
                "--out",
                "out/inspect",
            ]
        )
        == 0
    )
    assert main(["export", "--checkpoint", "runs/scratch", "--out", "out/model.safetensors"]) == 0
    assert main(["data", "scan", "link"]) == 0
    out = capsys.readouterr().out
    assert "10 classes" in out and Path("out/attn/attention.csv").is_file() and Path("out/model.json").is_file()
    assert Path("out/inspect/fig7c_mean_attention_distance.png").is_file()
