"""The fast paths compute what the plain paths compute; `vitlab bench` runs and reports sane numbers.

No timing is asserted here (machines differ); speed figures live in benchmarks/ and `vitlab bench`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitlab.models.vit as vm
from vitlab.runtime import num_threads
from vitlab.speed import bench, cpu_inference, cpu_training
from vitlab.cli import main
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.models.registry import get_config

SMALL = dict(img_size=32, patch_size=8, dim=64, depth=2, heads=4, num_classes=10)
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _small_model(seed: int = 0, **overrides) -> VisionTransformer:
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**{**SMALL, **overrides}))
    torch.nn.init.normal_(model.head.weight, std=0.2)  # a non-zero head: logits that depend on the image
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with num_threads(1):  # small tensors: threads only add contention on a shared machine
        yield


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=1) / b.norm(dim=1)


def test_bf16_logits_close_to_fp32_and_same_top1():
    model = _small_model().eval()
    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x).float()
    err = _rel_err(low, ref)
    assert err.max() < 0.02, f"bf16 logits off by up to {err.max():.4f} (median {err.median():.4f})"
    margin = ref.topk(2, dim=1).values.diff(dim=1).abs().squeeze(1)
    clear = margin > 4 * (low - ref).abs().max()  # images whose top-1 bf16 cannot flip
    assert clear.sum() >= 16
    assert torch.equal(low.argmax(1)[clear], ref.argmax(1)[clear])


@pytest.mark.skipif(not cpu_inference.supported("bf16"), reason="this CPU has no oneDNN bf16 kernels")
def test_packed_bf16_linears_give_the_autocast_logits():
    """vitlab.speed.cpu_inference casts and reorders each Linear weight once; in bf16 the product is autocast's
    kernel, so the logits are autocast's to the bit, and no nn.Linear is left to recast per call."""
    model = _small_model(dim=96, heads=3).eval()
    packed = cpu_inference.pack_for_cpu_inference(copy.deepcopy(model), "bf16", tokens_hint=8 * 17)
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert sum(isinstance(m, cpu_inference.PackedLinear) for m in packed.modules()) == 2 * 4 + 1  # 4 per block; head
    for batch in (1, 8, 13):  # other row counts than the hint
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            expected, got = model(x), packed(x)
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


@pytest.mark.skipif(not cpu_inference.supported("fp32"), reason="this torch build has no oneDNN")
def test_packed_fp32_linears_match_the_plain_model():
    """In fp32 oneDNN's product replaces MKL's: another summation order, the same logits to ~1e-6."""
    model = _small_model(dim=96, heads=3).eval()
    packed = cpu_inference.pack_for_cpu_inference(copy.deepcopy(model), "fp32")
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected, got = model(x), packed(x)
    assert got.dtype == torch.float32
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert torch.equal(got.argmax(1), expected.argmax(1))


def _linear_grads(linear: torch.nn.Linear, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    y = linear(x)
    y.backward(dy)
    out = [y.detach(), x.grad, linear.weight.grad, linear.bias.grad]
    linear.zero_grad(set_to_none=True)
    return out


@pytest.mark.skipif(not cpu_training.supported(), reason="this torch build has no oneDNN")
def test_training_linear_takes_onednn_on_big_products_and_matches_nn_linear(monkeypatch):
    """vitlab.speed.cpu_training: y and dx through oneDNN, dW and db as nn.Linear does; the same to float
    rounding, for a gradient that arrives non-contiguous too."""
    calls = []
    real = cpu_training._onednn_linear
    monkeypatch.setattr(cpu_training, "_onednn_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    plain = torch.nn.Linear(256, 320)
    swapped = torch.nn.Sequential(copy.deepcopy(plain))
    assert cpu_training.use_onednn_linears(swapped) == 1
    fast = swapped[0]
    assert isinstance(fast, cpu_training.TrainingLinear) and fast.weight.shape == (320, 256)
    x = torch.randn(4, 300, 256)  # 1200 rows >= MIN_ROWS
    dy = torch.randn(4, 320, 300).transpose(1, 2)  # (4, 300, 320), not contiguous
    expected, got = _linear_grads(plain, x, dy), _linear_grads(fast, x, dy)
    assert calls == [(4, 300, 256), (4, 300, 320)]  # forward y, backward dx
    for name, e, g in zip(("y", "dx", "dW", "db"), expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4, msg=name)
    calls.clear()
    _linear_grads(fast, x[:, :200], dy[:, :200])  # 800 rows: below MIN_ROWS, nn.Linear's products
    with torch.no_grad():
        fast(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast(x)
    fast.eval()
    fast(x)
    fast.train()
    # torch.export (as `vitlab export` runs) traces nn.Linear's product, with no guard on a dynamic batch
    program = torch.export.export(swapped, (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    assert calls == []
    torch.testing.assert_close(program.module()(x[:3]), plain(x[:3]), rtol=1e-5, atol=1e-5)


def test_use_onednn_linears_keeps_the_parameters_and_small_models_bitwise():
    """The swap keeps each Parameter object (state_dict, optimizer, checkpoints unchanged); a model
    whose products are all small (vit_mini_x-like) trains bitwise as before."""
    plain = _small_model(seed=6).train()
    swapped = copy.deepcopy(plain)
    params = dict(swapped.named_parameters())
    assert cpu_training.use_onednn_linears(copy.deepcopy(plain).to("meta")) == 0  # off the CPU: left as it is
    n = cpu_training.use_onednn_linears(swapped)
    assert n == (2 * 4 + 1 if cpu_training.supported() else 0)  # 4 per block; head
    assert {k: id(v) for k, v in swapped.named_parameters()} == {k: id(v) for k, v in params.items()}
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    x, y = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(6)), torch.arange(4)
    for model in (plain, swapped):
        F.cross_entropy(model(x), y).backward()
    for (name, a), b in zip(plain.named_parameters(), swapped.parameters()):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.skipif(not cpu_training.supported(), reason="this torch build has no oneDNN")
def test_a_vit_training_step_with_onednn_linears_matches_the_plain_one():
    """A ViT whose products are big enough (dim 256, 4 x 257 = 1028 rows): the same gradients to float
    rounding (compared before the optimizer, whose Adam normalisation would magnify ~0 ones)."""
    cfg = dict(img_size=64, patch_size=4, dim=256, depth=1, heads=4, num_classes=10)
    plain = _small_model(seed=7, **cfg).train()
    fast = copy.deepcopy(plain)
    cpu_training.use_onednn_linears(fast)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    y = torch.arange(4)
    assert cpu_training.pays_off(torch.zeros(4, 257, 256), fast.blocks[0].attn.qkv)
    losses = [F.cross_entropy(model(x), y) for model in (plain, fast)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
        assert (b.grad - a.grad).abs().max() <= 1e-4 * a.grad.abs().max(), name


def test_bf16_on_cpu_takes_explicit_products_and_they_match_the_fused_kernel(monkeypatch):
    q = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    assert vm.explicit_is_faster(q) and not vm.explicit_is_faster(q.float())
    model = _small_model().eval()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        explicit = model(x).float()  # one slice: 8 images x 4 heads x 17^2 logits < EXPLICIT_SLICE
        whole = model(x, return_attention=True)[0].float()
        monkeypatch.setattr(vm, "EXPLICIT_SLICE", 3 * 4 * 17 * 17)  # slices of 3 images: 3 + 3 + 2
        sliced = model(x).float()
        monkeypatch.setattr(vm, "explicit_is_faster", lambda q: False)
        fused = model(x).float()
    torch.testing.assert_close(explicit, whole, rtol=0, atol=0)
    torch.testing.assert_close(sliced, explicit, rtol=1e-3, atol=1e-3)  # slices change no product
    assert _rel_err(explicit, fused).max() < 0.02
    with torch.no_grad():
        assert torch.allclose(model(x), model(x, return_attention=True)[0], atol=1e-5)


def test_bf16_training_step_backward_through_explicit_path():
    model = _small_model().train()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    y = torch.arange(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # the attention got its gradient


def test_checkpointed_gradients_equal_plain_ones():
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    y = torch.arange(4)
    grads = []
    for ckpt in (False, True):
        model = _small_model(seed=5).train()
        model.set_grad_checkpointing(ckpt)
        F.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_race_alternates_and_times_every_repeat():
    calls = []
    times = bench.race({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, warmup=1, repeats=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then the order flips each repeat
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_timm_twin_has_the_same_weights_and_logits():
    pytest.importorskip("timm")
    model = _small_model().eval()
    twin = bench.timm_twin(model).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-5)


def test_memory_estimate_orders_the_runs():
    cfg = get_config("vit_base_patch16_224")
    plain = bench.estimate_memory(cfg, 16, train=True)
    ckpt = bench.estimate_memory(cfg, 16, train=True, grad_checkpointing=True)
    infer = bench.estimate_memory(cfg, 1, train=False)
    assert plain["weights"] == 86_567_656 * 4  # ViT-B/16's parameters, fp32
    assert plain["total"] == sum(v for k, v in plain.items() if k != "total")
    assert ckpt["activations"] < 0.3 * plain["activations"]
    assert infer["total"] < 1.5 * infer["weights"]
    assert bench.estimate_memory(cfg, 16, precision="bf16")["activations"] < plain["activations"]


def test_measured_peak_memory_of_inference_is_near_the_weights():
    out = bench.measure_peak_memory("vit_tiny_patch16_224", 1, train=False, threads=1)
    assert out["weights_bytes"] == 5_717_416 * 4
    assert out["weights_bytes"] <= out["peak_bytes"] < out["weights_bytes"] + 200 * 2**20


def test_bench_cli_quick_json(capsys):
    pytest.importorskip("timm")
    code = main(["bench", "--quick", "--json", "--train", "--against", "timm", "--repeats", "1", "--warmup", "0",
                 "--matmul-size", "64", "--batch-size", "2", "--threads", "1"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["matmul_flops"]) == {"fp32", "bf16"} and all(v > 0 for v in result["matmul_flops"].values())
    rows = {(r["mode"], r["library"]): r for r in result["rows"]}
    assert set(rows) == {("infer", "vitlab"), ("infer", "timm"), ("train", "vitlab"), ("train", "timm")}
    for r in rows.values():
        assert r["images_per_s"] == pytest.approx(2 / r["seconds"])
        assert r["mfu"] == pytest.approx(r["flops_per_s"] / result["matmul_flops"]["fp32"])
    infer = rows[("infer", "vitlab")]
    assert infer["flops_per_s"] == pytest.approx(bench.forward_flops(get_config("vit_mini_x")) * 2 / infer["seconds"])
    assert rows[("train", "vitlab")]["ratio"] == pytest.approx(
        rows[("train", "vitlab")]["images_per_s"] / rows[("train", "timm")]["images_per_s"])
    assert rows[("infer", "timm")]["ratio"] is None
    packed = cpu_inference.supported("fp32")
    assert result["inference"] == ("vitlab: Linear weights packed once (vitlab.speed.cpu_inference); timm: as shipped"
                                   if packed else "both models as they are")
    assert result["training"] == ("vitlab: big fp32 Linear products through oneDNN (vitlab.speed.cpu_training); timm: as "
                                  "shipped" if cpu_training.supported() else "both models as they are")
    code = main(["bench", "--quick", "--json", "--no-pack", "--repeats", "1", "--warmup", "0", "--matmul-size", "64",
                 "--batch-size", "2", "--threads", "1"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["inference"] == result["training"] == "both models as they are"


def test_bench_cli_errors_are_one_line(capsys):
    assert main(["bench", "--model", "resnet_mini", "--quick", "--repeats", "1", "--matmul-size", "32"]) == 2
    assert "CNN baseline" in capsys.readouterr().err
    assert main(["bench", "--model", "vit_mini_x", "--against", "timm", "--quick", "--matmul-size", "32",
                 "--repeats", "0"]) == 2
    assert "--repeats must be an integer >= 1; found 0" in capsys.readouterr().err


def _load_gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", BENCHMARKS / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_bench_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    assert _load_gpu_bench().main(["--dry-run", "--no-compile", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert run["variant"] == "eager" and run["images_per_s"] > 0 and 0 < run["mfu"]
    assert run["images_per_s"] == pytest.approx(8 / run["step_s"])


@pytest.mark.slow
def test_compiled_model_equals_eager():
    model = _small_model().eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_gpu_bench_dry_run_with_compile(tmp_path):
    out = tmp_path / "gpu.json"
    assert _load_gpu_bench().main(["--dry-run", "--json", str(out)]) == 0
    assert [r["variant"] for r in json.loads(out.read_text())["runs"]] == ["eager", "compiled"]
