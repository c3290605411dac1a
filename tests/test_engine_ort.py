"""ONNX Runtime as an engine of vitlab's inference: chosen by fixed rules on what the machine is, the model's ONNX
file built once per weights and checked against PyTorch, the same top-5 as PyTorch, and PyTorch (said in one line)
where ONNX Runtime cannot run. No test here times anything."""

from __future__ import annotations

import argparse
import inspect
import json

import pytest
import torch
from PIL import Image

from vitlab import create_model, options
from vitlab.cli import main
from vitlab.cli.commands import build_parser
from vitlab.errors import VitlabError
from vitlab.inference import engine as E
from vitlab.inference.export import export_model
from vitlab.inference.predict import predict_files
from vitlab.serve import look
from vitlab.serve.models import LoadedModel, ModelSource, ModelStore
from vitlab.speed import rules
from vitlab.speed.machine import Machine, kind_of

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: its engine cannot be compared")

CPU = torch.device("cpu")
VIT_S = 9.2e9  # forward FLOPs per image of ViT-S/16


def _machine(vendor: str, *flags: str) -> Machine:
    return Machine(cpu=f"a {vendor} CPU", vendor=vendor, kind=kind_of(frozenset(flags)), flags=frozenset(flags))


AMD_ZEN4 = _machine("amd", "avx2", "fma", "avx512f", "avx512_bf16")
AMD_EPYC_AVX2 = _machine("amd", "avx2", "fma")
INTEL_COOPER_LAKE = _machine("intel", "avx2", "fma", "avx512f", "avx512_bf16")
XEON_AMX = _machine("intel", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A small ViT with a trained-looking head, exported as a checkpoint, and five images."""
    folder = tmp_path_factory.mktemp("engine")
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=10)
    torch.nn.init.normal_(model.head.weight, std=0.2)
    export_model(model, folder / "m.safetensors")
    g = torch.Generator().manual_seed(0)
    images = []
    for i in range(5):
        path = folder / f"{i}.png"
        Image.fromarray((torch.rand(40, 40, 3, generator=g) * 255).byte().numpy()).save(path)
        images.append(str(path))
    return folder / "m.safetensors", images


def _predict(capsys, checkpoint, images, *flags) -> tuple[list[dict], list[str]]:
    common = ["--checkpoint", str(checkpoint), "--json", "--device", "cpu", "--batch-size", "2"]
    assert main(["predict", *images, *common, *flags]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)["results"], err.splitlines()


def _same_top5(a: list[dict], b: list[dict], tol: float) -> None:
    for r, s in zip(a, b, strict=True):
        assert [p["index"] for p in r["predictions"]] == [p["index"] for p in s["predictions"]], r["file"]
        assert max(abs(p["prob"] - q["prob"]) for p, q in zip(r["predictions"], s["predictions"])) <= tol


# ----------------------------------------------------------------------------------------------------
# The rule


def test_the_rule_picks_onnxruntime_exactly_on_the_machine_kinds_and_batches_it_names():
    """ONNX Runtime for fp32 at batch 1 on an AMD with AVX-512 and bf16 (Zen 4, where it was measured faster), and
    on an Intel with AMX for a run too short to compile; PyTorch on every other machine kind, batch, precision, for
    a small model and off the CPU."""

    def engine(machine, precision="fp32", batch=1, flops=VIT_S, device="cpu", images=1):
        name, source = rules.engine_by_rules(
            machine, precision=precision, batch_size=batch, flops_per_item=flops, images=images, device_type=device
        )
        return name

    assert engine(AMD_ZEN4) == "onnxruntime"
    assert rules.engine_by_rules(AMD_ZEN4, precision="fp32", batch_size=1, flops_per_item=VIT_S)[1] == (
        "rules (avx512-bf16, amd)"
    )
    assert [engine(AMD_ZEN4, batch=b) for b in (2, 8, 32)] == ["torch"] * 3
    assert engine(AMD_ZEN4, precision="bf16") == "torch"
    for other in (AMD_EPYC_AVX2, INTEL_COOPER_LAKE, _machine("other", "neon")):
        assert engine(other) == "torch", other.kind
    # the Xeon: ONNX Runtime where the PyTorch plan would not compile, the compiled plan where it would
    long_run = int(rules.COMPILE_FLOPS / VIT_S) + 1
    assert [engine(XEON_AMX, images=n) for n in (1, 100, long_run)] == ["onnxruntime", "onnxruntime", "torch"]
    assert engine(XEON_AMX, images=None) == "torch"  # a server: no known length, not a short run
    assert rules.plan_by_rules(
        XEON_AMX, mode="inference", precision="fp32", batch_size=1, flops_per_item=VIT_S, items=long_run
    ).compile
    assert engine(XEON_AMX, batch=2) == engine(XEON_AMX, precision="bf16") == "torch"
    assert engine(AMD_ZEN4, images=long_run) == engine(AMD_ZEN4, images=None) == "onnxruntime"  # no run length
    assert engine(AMD_ZEN4, flops=rules.SMALL_FLOPS / 2) == "torch"  # measured on ViT-S/16, not on small models
    assert engine(AMD_ZEN4, device="cuda") == "torch"
    assert all(r.precision == "fp32" for r in rules.ENGINE_RULES)  # its CPU provider has no bf16 products


def test_auto_is_the_one_default_engine_of_every_function_and_command_that_takes_one():
    takers = [predict_files, ModelStore, LoadedModel, E.inference_engine, E.serving_engine]
    for taker in takers:
        assert inspect.signature(taker).parameters["engine"].default == options.DEFAULT_ENGINE == "auto", taker
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {name for name, p in commands.items() if p.get_default("engine")} == {"predict", "serve"}
    assert {commands[c].get_default("engine") for c in ("predict", "serve")} == {options.DEFAULT_ENGINE}


# ----------------------------------------------------------------------------------------------------
# What ONNX Runtime computes


def test_predict_on_onnxruntime_gives_torchs_top5_and_the_same_numbers_every_run(weights, capsys):
    checkpoint, images = weights
    torch_results, torch_said = _predict(capsys, checkpoint, images, "--engine", "torch")
    assert [line for line in torch_said if line.startswith("engine:")] == ["engine: torch [--engine torch]"]
    assert sum(line.startswith("fast path:") for line in torch_said) == 1
    runs = [_predict(capsys, checkpoint, images, "--engine", "onnxruntime") for _ in range(2)]
    for results, said in runs:
        (line,) = [line for line in said if line.startswith("engine:")]
        assert line.startswith("engine: onnxruntime (CPU provider, ") and line.endswith("[--engine onnxruntime]")
        assert not any(line.startswith("fast path:") for line in said)  # PyTorch's plan does not run
        _same_top5(torch_results, results, tol=1e-4)
    assert runs[0][0] == runs[1][0]  # a fixed thread count: the same probabilities, bitwise, run to run
    exported = [line for _, said in runs for line in said if line.startswith("exported the model to ONNX")]
    assert len(exported) <= 1  # built once (none here if an earlier test built it for these weights)


def test_the_onnx_file_is_built_once_per_weights_and_the_model_left_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    exports = []
    real = E.export_onnx
    monkeypatch.setattr(E, "export_onnx", lambda *a, **k: exports.append(a[1]) or real(*a, **k))
    torch.manual_seed(1)
    model = create_model("vit_mini", num_classes=10, depth=1).eval()
    torch.nn.init.normal_(model.head.weight, std=0.2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    said = []
    first = E.onnxruntime_model(model, precision="fp32", device=CPU, log=said.append)
    second = E.onnxruntime_model(model, precision="fp32", device=CPU, log=said.append)
    key = E.onnx_key(model)
    assert exports == [tmp_path / "onnx" / f"{key}.onnx"] == [first.path] == [second.path]  # the second: no export
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [f"{key}.onnx"]  # nothing half-written left
    assert len(said) == 1 and "max abs" in said[0]
    with torch.no_grad():
        assert (first(x) - model(x)).abs().max() <= E.ONNX_TOLERANCE
    assert torch.equal(first(x), second(x))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()) and not model.training
    changed = create_model("vit_mini", num_classes=10, depth=1)
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        changed.head.bias[0] += 1e-3
    assert E.onnx_key(changed) != key and not E.onnx_path(changed).exists()  # a changed weight: a new file
    assert E.onnx_key(create_model("vit_mini", num_classes=10, depth=1)) != key  # other weights, another key


# ----------------------------------------------------------------------------------------------------
# Where ONNX Runtime cannot run: PyTorch, and one line saying why


def test_missing_onnxruntime_falls_back_to_torch_in_one_line(weights, monkeypatch, capsys):
    checkpoint, images = weights
    torch_results, _ = _predict(capsys, checkpoint, images, "--engine", "torch")

    def missing():
        raise ImportError("No module named 'onnxruntime'")

    monkeypatch.setattr(E, "import_onnxruntime", missing)
    results, said = _predict(capsys, checkpoint, images, "--engine", "onnxruntime")
    assert [line for line in said if line.startswith("engine:")] == [
        "engine: torch, not ONNX Runtime: onnxruntime is not installed (No module named 'onnxruntime'; pip install "
        "onnxruntime) [--engine onnxruntime]"
    ]
    assert results == torch_results  # PyTorch ran, as with --engine torch
    _, said = _predict(capsys, checkpoint, images, "--engine", "onnxruntime", "--precision", "bf16")
    assert [line for line in said if line.startswith("engine:")] == [
        "engine: torch, not ONNX Runtime: ONNX Runtime's CPU provider has no bf16 matrix products [--engine "
        "onnxruntime]"
    ]
    model = create_model("vit_mini", num_classes=10)
    fn, path = E.serving_engine(model, engine="onnxruntime", precision="fp32", device=CPU)
    assert path.startswith("fused attention") and "(not ONNX Runtime: onnxruntime is not installed (" in path


def test_a_bad_engine_is_refused_in_one_line(weights, capsys):
    checkpoint, images = weights
    assert main(["predict", images[0], "--checkpoint", str(checkpoint), "--engine", "tensorrt"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--engine" in line and "'tensorrt'" in line and "onnxruntime" in line
    model = create_model("vit_mini", num_classes=10)
    torch.nn.init.normal_(model.head.weight, std=0.2)
    with pytest.raises(VitlabError, match=r"^engine must be one of auto, torch, onnxruntime; found 'tensorrt'$"):
        predict_files(model, images, engine="tensorrt")
    with pytest.raises(VitlabError, match="engine must be one of"):
        ModelStore(device="cpu", engine="ort")


# ----------------------------------------------------------------------------------------------------
# vitlab serve: the top-k on ONNX Runtime, the attention maps on PyTorch


def test_serve_answers_the_topk_on_onnxruntime_with_torchs_top5(weights):
    checkpoint, images = weights
    stores = {e: ModelStore(device="cpu", engine=e) for e in ("torch", "onnxruntime")}
    loaded = {e: store.load(ModelSource(checkpoint=str(checkpoint))) for e, store in stores.items()}
    for one in loaded.values():
        assert one.ready.wait(300)
    assert loaded["onnxruntime"].path.startswith("onnxruntime (CPU provider")
    assert isinstance(loaded["onnxruntime"].for_topk().fn, E.OnnxRuntimeModel)
    assert loaded["torch"].path.startswith("fused attention")  # PyTorch's plan
    _same_top5(*(look.predict(loaded[e], images) for e in ("torch", "onnxruntime")), tol=1e-4)
    overlay = look.attention_overlay(loaded["onnxruntime"], images[0])  # the model as built, on PyTorch
    assert overlay.picture.ndim == 3


def test_auto_takes_pytorch_where_a_pytorch_path_is_asked_for():
    """`--fast-path` other than the default names a PyTorch path: "auto" is PyTorch then, without asking the rules."""
    model = create_model("vit_mini", num_classes=10)
    for fast, said in (
        ("off", "--fast-path off"),
        ("tuned", "--fast-path tuned"),
        (rules.AS_BUILT, "--fast-path a plan"),
    ):
        kw = dict(engine="auto", precision="fp32", batch_size=1, device=CPU, fast=fast)
        assert E.choose_engine(model, **kw) == ("torch", said)
    assert E.choose_engine(model, engine="onnxruntime", precision="fp32", batch_size=1, device=CPU, fast="off") == (
        "onnxruntime",
        "--engine onnxruntime",
    )
