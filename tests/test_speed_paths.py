"""The fast paths compute what the plain paths compute; `vitlab bench` runs and reports sane numbers.

No timing is asserted here (machines differ); speed figures live in benchmarks/ and `vitlab bench`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitlab.models.vit as vm
from vitlab.runtime import num_threads
from vitlab.speed import bench, calibration, compiled, cpu_inference, cpu_training, fastpath, pieces
from vitlab.speed.attention import choose_attention
from vitlab.speed.calibration import Calibration
from vitlab.train.engine import TensorLoader, fit
from vitlab.train.recipe import Recipe
from vitlab.cli import main
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.inference.export import export_model
from vitlab.models.factory import create_model
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


def _calibration(tmp_path, **choices) -> Calibration:
    """A calibration in tmp_path whose entries say `choice` for the keys given (no measuring)."""
    cal = Calibration(tmp_path / "cal.json")
    for key, choice in choices.items():
        cal.put(key, {"choice": choice, "seconds": {}})
    return cal


def test_calibration_is_written_read_and_invalidated_by_cpu_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = calibration.cache_file()
    assert path.parent == tmp_path / "xdg" / "vitlab" / "speed"
    assert torch.__version__.replace("+", "+") in path.name
    calls = []
    slow, fast = (lambda: calls.append("slow") or time.sleep(0.003)), (lambda: calls.append("fast"))
    cal = Calibration(path)
    assert cal.choose("k", {"slow": slow, "fast": fast}) == "fast"  # the default loses by far more than MARGIN
    n = len(calls)
    assert cal.choose("k", {"slow": slow, "fast": fast}) == "fast" and len(calls) == n  # remembered, not re-run
    saved = json.loads(path.read_text())
    assert saved["machine"] == calibration.machine_key() and saved["entries"]["k"]["choice"] == "fast"
    assert Calibration(path).get("k")["choice"] == "fast"  # another process reads it
    # another torch (or CPU) in the same file: not valid here, measured again
    monkeypatch.setattr(calibration, "machine_key", lambda: {**saved["machine"], "torch": "0.0.0"})
    assert Calibration(path).get("k") is None
    monkeypatch.setattr(calibration, "machine_key", lambda: {**saved["machine"], "cpu": "Another CPU"})
    assert Calibration(path).get("k") is None
    assert calibration.cache_file() != path  # and its own file name
    Calibration(path).clear()
    assert not path.exists()


def test_a_choice_against_the_default_is_confirmed_by_a_second_round(tmp_path):
    """A default slowed through one whole round (a noisy phase of a shared machine) is measured again and
    kept; a candidate faster in both rounds is chosen; the default winning the first round needs no second."""
    calls = {"default": 0}

    def default_noisy_at_first():
        calls["default"] += 1
        time.sleep(0.004 if calls["default"] <= 4 else 0.0)  # the warm-up and the first round's 3 repeats

    def other():
        time.sleep(0.001)

    cal = Calibration(tmp_path / "cal.json")
    assert cal.choose("noisy", {"default": default_noisy_at_first, "other": other}) == "default"
    assert cal.get("noisy")["rounds"] == 2 and calls["default"] == 1 + 3 + 1 + 3
    assert cal.choose("slow", {"default": lambda: time.sleep(0.004), "other": other}) == "other"
    assert cal.get("slow")["rounds"] == 2
    assert cal.choose("fast", {"default": lambda: None, "other": other}) == "default"
    assert cal.get("fast")["rounds"] == 1


def test_a_candidate_replaces_the_default_only_when_clearly_faster():
    assert calibration.pick({"plain": 1.0, "packed": 0.99}) == "plain"  # within the noise: keep the default
    assert calibration.pick({"plain": 1.0, "packed": 0.9}) == "packed"
    assert calibration.pick({"plain": 1.0, "packed": 1.5}) == "plain"


@pytest.mark.skipif(not cpu_inference.supported("bf16"), reason="this CPU has no oneDNN bf16 kernels")
def test_packed_bf16_linears_give_the_autocast_products_and_logits_as_close_to_fp32():
    """vitlab.speed.cpu_inference casts and reorders each Linear weight once; in bf16 the product is autocast's
    kernel, bitwise. The MLP's GELU, fused into fc1's kernel, rounds once instead of twice, so the packed model's
    logits are as close to fp32 as autocast's; no nn.Linear is left to recast per call."""
    lin = torch.nn.Linear(96, 288)
    x = torch.randn(2, 17, 96, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(cpu_inference.PackedLinear(lin, torch.bfloat16, 34)(x), lin(x))
        fused = cpu_inference.PackedLinear(lin, torch.bfloat16, 34, gelu="none")(x).float()
        torch.testing.assert_close(fused, F.gelu(F.linear(x, lin.weight, lin.bias).float()), rtol=2e-2, atol=2e-2)
    model = _small_model(dim=96, heads=3).eval()
    packed = copy.deepcopy(model)
    assert cpu_inference.pack_for_cpu_inference(packed, "bf16", 8 * 17, measure=False) == 2 * 4 + 1  # 4 per block; head
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert isinstance(packed.blocks[0].mlp.act, torch.nn.Identity) and packed.blocks[0].mlp.fc1.post_op == "gelu"
    for batch in (1, 8, 13):  # other row counts than the hint
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            ref = model(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                autocast, got = model(x), packed(x)
        assert got.dtype == torch.bfloat16
        assert _rel_err(got.float(), ref).max() <= 1.25 * _rel_err(autocast.float(), ref).max() + 1e-3


@pytest.mark.skipif(not cpu_inference.mkl_packing_available("fp32"), reason="this torch build has no MKL")
def test_mkl_packed_linear_is_nn_linear_for_every_row_count():
    """MKL's packed GEMM (what inductor's freezing uses for fp32) runs nn.Linear's arithmetic: the same
    products to float rounding, for the row count it was packed for and for others, 2-D or 3-D."""
    lin = torch.nn.Linear(96, 288)
    packed = cpu_inference.PackedLinear(lin, torch.float32, 34, library="mkl")
    for shape in ((34, 96), (5, 96), (2, 17, 96), (1, 1, 96)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), lin(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="MKL packs fp32 weights"):
        cpu_inference.PackedLinear(lin, torch.float32, 34, gelu="none", library="mkl")


def test_a_choice_measured_among_other_candidates_is_measured_again(tmp_path):
    """A kernel added since a choice was measured (MKL's packed product, say) gets its chance: the old
    answer is not reused; one set by hand (no timings) or measured among the same candidates is."""
    cal = Calibration(tmp_path / "cal.json")
    cal.put("k", {"choice": "plain", "seconds": {"plain": 1.0, "packed": 1.1}})
    cal.put("hand", {"choice": "packed", "seconds": {}})
    assert cal.known("k", ["plain", "packed"]) == "plain" and cal.known("hand", ["plain", "packed", "new"]) == "packed"
    assert cal.known("k", ["plain", "packed", "new"]) is None
    calls = []
    choice = cal.choose("k", {"plain": lambda: calls.append("plain") or time.sleep(0.003),
                              "packed": lambda: calls.append("packed") or time.sleep(0.003),
                              "new": lambda: calls.append("new")})
    assert choice == "new" and "new" in calls
    assert set(Calibration(tmp_path / "cal.json").get("k")["seconds"]) == {"plain", "packed", "new"}


@pytest.mark.skipif(not cpu_inference.supported("fp32"), reason="this torch build has no oneDNN")
def test_packed_fp32_linears_match_the_plain_model_and_pack_only_where_measured_faster(tmp_path):
    """In fp32 oneDNN's product replaces MKL's: another summation order, the same logits to ~1e-6. A layer
    is packed only where this machine's calibration says packing pays at its shape."""
    model = _small_model(dim=96, heads=3).eval()
    rows = 5 * 17
    mkl = "packed-mkl" if cpu_inference.mkl_packing_available("fp32") else "plain"
    cal = _calibration(tmp_path, **{f"infer-linear/fp32/t1/{rows}x96x288": "packed",  # qkv
                                    f"infer-linear/fp32/t1/{rows}x96x96": "plain",  # proj
                                    f"infer-linear+gelu-none/fp32/t1/{rows}x96x384": "packed",  # fc1, GELU fused
                                    f"infer-linear/fp32/t1/{rows}x384x96": mkl,  # fc2
                                    f"infer-linear/fp32/t1/{rows}x96x10": "plain"})  # head
    packed = copy.deepcopy(model)
    assert cpu_inference.pack_for_cpu_inference(packed, "fp32", rows, cal=cal) == 2 * (2 + (mkl != "plain"))
    assert isinstance(packed.blocks[1].attn.qkv, cpu_inference.PackedLinear)
    assert type(packed.blocks[1].attn.proj) is torch.nn.Linear and packed.blocks[1].mlp.fc1.post_op == "gelu"
    if mkl != "plain":
        assert packed.blocks[1].mlp.fc2.library == "mkl" and packed.blocks[1].attn.qkv.library == "onednn"
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
def test_training_linear_takes_the_library_measured_faster_and_matches_nn_linear(monkeypatch, tmp_path):
    """vitlab.speed.cpu_training: y and dx each through the library this machine's calibration chose for the
    product's shape, dW and db as nn.Linear does; the same to float rounding, for a gradient that arrives
    non-contiguous too."""
    calls = []
    real = cpu_training._onednn_linear
    monkeypatch.setattr(cpu_training, "_onednn_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    cal = _calibration(tmp_path, **{"train-linear-y/fp32/t1/1200x256x320": "onednn",
                                    "train-linear-dx/fp32/t1/1200x256x320": "onednn",
                                    "train-linear-y/fp32/t1/800x256x320": "mkl",
                                    "train-linear-dx/fp32/t1/800x256x320": "onednn",
                                    "train-linear-y/fp32/t1/4x256x320": "mkl",
                                    "train-linear-dx/fp32/t1/4x256x320": "mkl"})
    torch.manual_seed(0)
    plain = torch.nn.Linear(256, 320)
    swapped = torch.nn.Sequential(copy.deepcopy(plain))
    assert cpu_training.use_onednn_linears(swapped, cal) == 1
    fast = swapped[0]
    assert isinstance(fast, cpu_training.TrainingLinear) and fast.weight.shape == (320, 256)
    x = torch.randn(4, 300, 256)  # 1200 rows
    dy = torch.randn(4, 320, 300).transpose(1, 2)  # (4, 300, 320), not contiguous
    expected, got = _linear_grads(plain, x, dy), _linear_grads(fast, x, dy)
    assert calls == [(4, 300, 256), (4, 300, 320)]  # forward y, backward dx
    for name, e, g in zip(("y", "dx", "dW", "db"), expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4, msg=name)
    calls.clear()
    for name, e, g in zip(("y", "dx", "dW", "db"), _linear_grads(plain, x[:, :200], dy[:, :200]),
                          _linear_grads(fast, x[:, :200], dy[:, :200])):  # 800 rows: dx alone by oneDNN
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4, msg=name)
    assert calls == [(4, 200, 320)]
    calls.clear()
    for a, b in zip(_linear_grads(plain, x[:, :1], dy[:, :1]), _linear_grads(fast, x[:, :1], dy[:, :1])):
        assert torch.equal(a, b)  # 4 rows: MKL for both, nn.Linear's products bitwise
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


def test_use_onednn_linears_keeps_the_parameters(tmp_path):
    """The swap keeps each Parameter object (state_dict, optimizer, checkpoints unchanged); where MKL is
    the faster library for every product, training is bitwise nn.Linear's."""
    plain = _small_model(seed=6).train()
    swapped = copy.deepcopy(plain)
    params = dict(swapped.named_parameters())
    assert cpu_training.use_onednn_linears(copy.deepcopy(plain).to("meta")) == 0  # off the CPU: left as it is
    cal = Calibration(tmp_path / "cal.json")
    n = cpu_training.use_onednn_linears(swapped, cal)
    assert n == (2 * 4 + 1 if cpu_training.supported() else 0)  # 4 per block; head
    assert {k: id(v) for k, v in swapped.named_parameters()} == {k: id(v) for k, v in params.items()}
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    x, y = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(6)), torch.arange(4)
    for model in (plain, swapped):
        F.cross_entropy(model(x), y).backward()
    assert {k.split("/")[0] for k in cal.entries} <= {"train-linear-y", "train-linear-dx"}  # measured on first use
    for (name, a), b in zip(plain.named_parameters(), swapped.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    cal.entries = {k: {"choice": "mkl"} for k in cal.entries}  # MKL everywhere: nn.Linear's products, bitwise
    for p in list(plain.parameters()) + list(swapped.parameters()):
        p.grad = None
    for model in (plain, swapped):
        F.cross_entropy(model(x), y).backward()
    for (name, a), b in zip(plain.named_parameters(), swapped.parameters()):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.skipif(not cpu_training.supported(), reason="this torch build has no oneDNN")
def test_a_vit_training_step_with_onednn_linears_matches_the_plain_one(tmp_path):
    """A ViT whose products all take oneDNN: the same gradients to float rounding (compared before the
    optimizer, whose Adam normalisation would magnify ~0 ones)."""
    cfg = dict(img_size=64, patch_size=4, dim=256, depth=1, heads=4, num_classes=10)
    plain = _small_model(seed=7, **cfg).train()
    fast = copy.deepcopy(plain)
    cal = Calibration(tmp_path / "cal.json")
    cal.choose = lambda key, candidates, **kw: "onednn"  # every product through oneDNN, nothing timed
    cpu_training.use_onednn_linears(fast, cal)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    y = torch.arange(4)
    assert cpu_training.product_choice(4 * 257, 256, 768, cal) == (True, True)
    losses = [F.cross_entropy(model(x), y) for model in (plain, fast)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
        assert (b.grad - a.grad).abs().max() <= 1e-4 * a.grad.abs().max(), name


def test_a_training_linear_finds_its_calibration_once_not_on_every_call(monkeypatch):
    """The machine's calibration is looked up when the layers are swapped: found on every call, it read
    /proc/cpuinfo twice per product (~0.4 ms), which made a small model's training step 1.4x slower."""
    model = _small_model(seed=8).train()
    cpu_training.use_onednn_linears(model)
    monkeypatch.setattr(cpu_training, "calibration", lambda: pytest.fail("calibration() looked up in a step"))
    F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.arange(2)).backward()
    assert calibration.cpu_model() is calibration.cpu_model()  # read once per process


def _sides(model: VisionTransformer) -> tuple[set, set]:
    """(TrainingLinear.measured values, attention `fused` values) of a model."""
    return ({m.measured for m in model.modules() if isinstance(m, cpu_training.TrainingLinear)},
            {b.attn.fused for b in model.blocks})


@pytest.mark.skipif(not cpu_training.supported(), reason="this torch build has no oneDNN")
def test_the_kernels_chosen_alone_train_only_if_the_whole_step_is_faster_with_them(tmp_path):
    """`prepare_training` times a whole training step with the kernels chosen one operation at a time against
    the model as built (on a copy: the model's gradients stay None), keeps the faster (the measured kernels
    must win by 3%; its dropout does not move the run's random stream), remembers it, and says which it took
    and why; a step as built is bitwise the plain model's."""
    tokens = 17
    cal = _calibration(tmp_path, **{f"attention/train/fp32/t1/b4xh4xn{tokens}xd16": "explicit"})
    timed = []
    choose = cal.choose

    def timed_choose(key, candidates, **kw):
        timed.append((key, list(candidates)))
        for fn in candidates.values():
            fn()  # each side runs a step
        return choose(key, candidates, **kw)

    cal.choose = timed_choose
    model = _small_model(drop_path=0.1).train()
    state = torch.get_rng_state()
    fastpath.prepare_training(model, precision="fp32", batch_size=4, cal=cal)
    assert torch.equal(torch.get_rng_state(), state)  # the run's dropout draws stay those of a run that knew
    key = f"train-kernels/{compiled.signature(model)}/fp32/t1/b4"
    assert (key, ["as built", "measured kernels"]) in timed
    assert all(p.grad is None for p in model.parameters())
    seconds = cal.get(key)["seconds"]
    taken = ({True}, {False}) if cal.get(key)["choice"] == "measured kernels" else ({False}, {True})
    assert _sides(model) == taken  # as measured (noise decides here: both are fast)
    cal.put(key, {"choice": "as built", "seconds": {"as built": 0.0101, "measured kernels": 0.0104}})
    model = _small_model(drop_path=0.1).train()
    assert fastpath.prepare_training(model, precision="fp32", batch_size=4, cal=cal) == [
        "the model as built (fp32 products by the library measured faster here, explicit attention: measured "
        "here and not kept, a step 10.4 ms with them, 10.1 ms as built)"]
    assert _sides(model) == ({False}, {True})  # remembered: the record above decides, not a new timing
    x, y = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.arange(4)
    plain = _small_model(drop_path=0.1).train()
    for m in (plain, model):
        torch.manual_seed(2)  # the same drop-path draws
        F.cross_entropy(m(x), y).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), model.parameters()))
    cal.put(key, {"choice": "measured kernels", "seconds": {"as built": 20.0, "measured kernels": 10.0}})
    model = _small_model(drop_path=0.1).train()
    assert fastpath.prepare_training(model, precision="fp32", batch_size=4, cal=cal) == [
        "fp32 products by the library measured faster here", "explicit attention",
        "a step 10.00 s with them, 20.00 s as built"]
    assert _sides(model) == ({True}, {False})
    assert seconds.keys() == {"as built", "measured kernels"}
    assert fastpath.prepare_training(_small_model(), precision="fp32", batch_size=4, fast="off") == [
        "the model as built"]


def test_explicit_attention_matches_the_fused_kernel_and_is_chosen_by_measurement(monkeypatch, tmp_path):
    """The two attention paths of one model agree (fp32 to 1e-5, bf16 to bf16 rounding), the explicit one
    sliced over the batch or not; `choose_attention` sets the path the calibration chose for the shape."""
    model = _small_model().eval()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fused = model(x)
        model.set_fused_attention(False)
        assert not any(b.attn.fused for b in model.blocks)
        explicit = model(x)
        torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x, return_attention=True)[0], explicit, rtol=1e-5, atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x).float()  # one slice: 8 images x 4 heads x 17^2 logits < EXPLICIT_SLICE
            monkeypatch.setattr(vm, "EXPLICIT_SLICE", 3 * 4 * 17 * 17)  # slices of 3 images: 3 + 3 + 2
            sliced = model(x).float()
            model.set_fused_attention(True)
            low_fused = model(x).float()
    torch.testing.assert_close(sliced, low, rtol=1e-3, atol=1e-3)  # slices change no product
    assert _rel_err(low, low_fused).max() < 0.02
    cal = _calibration(tmp_path, **{"attention/infer/bf16/t1/b8xh4xn17xd16": "explicit",
                                    "attention/train/bf16/t1/b8xh4xn17xd16": "fused"})
    assert choose_attention(model, precision="bf16", batch_size=8, cal=cal) == "explicit"
    assert not any(b.attn.fused for b in model.blocks)
    assert choose_attention(model, precision="bf16", batch_size=8, train=True, cal=cal) == "fused"
    assert all(b.attn.fused for b in model.blocks)
    assert choose_attention(model, precision="fp32", batch_size=2, cal=cal) in ("fused", "explicit")  # measured
    assert "attention/infer/fp32/t1/b2xh4xn17xd16" in cal.entries


@pytest.mark.parametrize("overrides", [{}, {"pos_embed": "relative"}, {"pos_embed": "learned2d"},
                                       {"pool": "mean", "class_token": False}])
def test_the_last_block_computes_the_class_token_alone_and_changes_no_logit(overrides):
    """`forward` runs the last block for the class token only (Eq. 4 reads nothing else): the logits and
    every gradient equal those of the full forward_features (fp32, 1e-5), checkpointed or not; a model
    without a class token runs in full."""
    model = _small_model(**overrides).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model.forward_head(model.forward_features(x))
        torch.testing.assert_close(model(x), full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x, return_attention=[0])[0], full, rtol=1e-5, atol=1e-5)
        cls_only = model.forward_features(x, class_token_only=True)
    assert cls_only.shape == ((3, 1, 64) if model.cfg.class_token else (3, 16, 64))  # no class token: every patch
    y = torch.arange(3)
    for ckpt in (False, True):
        model.train().set_grad_checkpointing(ckpt)
        grads = []
        for forward in (model, lambda x: model.forward_head(model.forward_features(x))):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(forward(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for name, g in grads[0].items():
            assert (g - grads[1][name]).abs().max() <= 1e-5 * grads[1][name].abs().max(), name


def test_explicit_attention_trains_as_the_fused_kernel():
    """Gradients through the explicit path equal the fused kernel's (fp32), and are finite in bf16."""
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    y = torch.arange(4)
    grads = []
    for fused in (True, False):
        model = _small_model().train()
        model.set_fused_attention(fused)
        F.cross_entropy(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
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
    # a fast call is repeated within a repeat to last min_repeat_s; the times stay per call
    calls.clear()
    times = bench.race({"slow": lambda: calls.append("s") or time.sleep(0.02), "fast": lambda: calls.append("f")},
                       warmup=1, repeats=2, min_repeat_s=0.02)
    assert calls.count("s") == 1 + 2 and calls.count("f") > 10 * (1 + 2)
    assert all(t >= 0.02 for t in times["slow"]) and all(t < 0.005 for t in times["fast"])


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
    """`vitlab bench --json`: one object per measurement, every path on the same batch; vitlab's ratio to the
    fastest peer is the median of its back-to-back pairs; ONNX Runtime rows for fp32 inference only."""
    pytest.importorskip("timm")
    pytest.importorskip("onnxruntime")
    code = main(["bench", "--quick", "--json", "--train", "--against", "timm,onnxruntime", "--repeats", "3",
                 "--warmup", "0", "--matmul-size", "64", "--batch-size", "2", "--threads", "1",
                 "--precision", "fp32", "bf16"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list)
    by = {(r["mode"], r["precision"], r["path"]): r for r in rows}
    assert set(by) == {("inference", "fp32", "vitlab"), ("inference", "fp32", "timm"),
                       ("inference", "fp32", "onnxruntime"), ("inference", "bf16", "vitlab"),
                       ("inference", "bf16", "timm"), ("train", "fp32", "vitlab"), ("train", "fp32", "timm"),
                       ("train", "bf16", "vitlab"), ("train", "bf16", "timm")}
    for r in rows:
        assert {"model", "mode", "precision", "batch", "path", "images_per_s"} <= set(r)
        assert r["model"] == "vit_mini_x" and r["batch"] == 2 and r["threads"] == 1
        assert r["images_per_s"] == pytest.approx(2 / r["seconds"])
        assert r["seconds"] == pytest.approx(statistics.median(r["repeats"]))
        flops = bench.forward_flops(get_config("vit_mini_x")) * 2 * (3 if r["mode"] == "train" else 1)
        assert r["flops_per_s"] == pytest.approx(flops / r["seconds"])
        if r["path"] == "vitlab":
            peers = [p for (m, pr, p) in by if (m, pr) == (r["mode"], r["precision"]) and p != "vitlab"]
            assert r["vs_best_peer"] == pytest.approx(min(bench.paired_ratio(
                r["repeats"], by[(r["mode"], r["precision"], p)]["repeats"]) for p in peers))
        else:
            assert r["vs_best_peer"] is None
    assert "Linear weights packed" in by[("inference", "fp32", "vitlab")]["how"]
    assert by[("inference", "fp32", "timm")]["how"] == "as shipped"
    code = main(["bench", "--quick", "--fast-path", "off", "--repeats", "1", "--warmup", "0", "--matmul-size", "64",
                 "--batch-size", "2", "--threads", "1", "--against", "onnxruntime", "--precision", "bf16"])
    assert code == 0
    out = capsys.readouterr().out
    assert "  vitlab  " in out and out.count("the model as built") == 1
    assert "vit_mini_x inference bf16: no onnxruntime row: ONNX Runtime runs inference here, and its CPU provider " \
           "has no bf16 matrix products" in out


def test_bench_cli_errors_are_one_line(capsys):
    assert main(["bench", "--model", "resnet_mini", "--quick", "--repeats", "1", "--matmul-size", "32"]) == 2
    assert "CNN baseline" in capsys.readouterr().err
    assert main(["bench", "--model", "vit_mini_x", "--against", "timm", "--quick", "--matmul-size", "32",
                 "--repeats", "0"]) == 2
    assert "--repeats must be an integer >= 1; found 0" in capsys.readouterr().err
    assert main(["bench", "--quick", "--against", "timm,tensorrt", "--matmul-size", "32"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --against: unknown peer(s) tensorrt; expected a comma list of "
                                               "timm, compile, onnxruntime")


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
def test_gpu_bench_dry_run_with_compile(tmp_path):
    out = tmp_path / "gpu.json"
    assert _load_gpu_bench().main(["--dry-run", "--json", str(out)]) == 0
    assert [r["variant"] for r in json.loads(out.read_text())["runs"]] == ["eager", "compiled"]


# ----------------------------------------------------------------------------------------------------
# torch.compile: when it pays, and what it computes

TINY = dict(img_size=16, patch_size=8, dim=16, depth=1, heads=2, num_classes=5)


def test_compiling_is_decided_by_what_was_measured_here(tmp_path):
    cal = Calibration(tmp_path / "cal.json")
    key = "compile/inference/m/fp32/b8/t1"
    d = compiled.decide(cal, key, items=1000, uncompiled_s=None)
    assert not d.compile and not d.measured and "not measured" in d.reason
    # never measured: compile only when the run is long enough that a compile gaining nothing costs 10% at most
    d = compiled.decide(cal, key, items=1000, uncompiled_s=compiled.FIRST_COMPILE_S / 100 * 1.01)
    assert d.compile and not d.measured
    assert not compiled.decide(cal, key, items=1000, uncompiled_s=compiled.FIRST_COMPILE_S / 100 * 0.99).compile
    cal.put("compile/train/other/fp32/b8/t1", {"compile_s": 500.0, "compiled_s": 1.0, "uncompiled_s": 2.0})
    assert compiled.longest_compile(cal) == 500.0  # the longest compile measured here is the estimate
    assert not compiled.decide(cal, key, items=1000, uncompiled_s=compiled.FIRST_COMPILE_S / 100 * 1.01).compile
    # measured: compile when the images repay the compile time out of the seconds it saves per image
    cal.put(key, {"compile_s": 30.0, "compiled_s": 0.09, "uncompiled_s": 0.1})  # 0.01 s saved: pays after 3000
    d = compiled.decide(cal, key, items=3001, uncompiled_s=None)
    assert d.compile and d.measured and "pays after 3,000 images" in d.reason
    assert not compiled.decide(cal, key, items=2999, uncompiled_s=0.1).compile
    cal.put(key, {"compile_s": 30.0, "compiled_s": 0.11, "uncompiled_s": 0.1})
    assert not compiled.decide(cal, key, items=10**9, uncompiled_s=0.1).compile  # not faster: never
    assert compiled.decide(cal, key, items=1, uncompiled_s=0.1, choice=True).compile  # the user's word
    assert not compiled.decide(cal, "compile/x", items=10**9, uncompiled_s=1.0, choice=False).compile


def test_inference_runner_reports_its_path_and_keeps_the_logits(tmp_path):
    """One batch: the model as built. Several: the measured kernels (packed where the calibration says),
    the same logits to 1e-5 (fp32); `off` is the model as built whatever the run."""
    model = _small_model(dim=96, heads=3).eval()
    cal = Calibration(tmp_path / "cal.json")
    x = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = model(x)
        one = fastpath.InferenceRunner(model, precision="fp32", batch_size=16, images=10, device=torch.device("cpu"),
                                       cal=cal)
        assert one.describe() == "the model as built (one batch: preparing a faster path would cost more than it saves)"
        assert torch.equal(one(x), expected) and cal.entries == {}  # nothing measured for a single batch
        off = fastpath.InferenceRunner(model, precision="fp32", batch_size=4, images=10, device=torch.device("cpu"),
                                       fast="off", cal=cal)
        assert off.describe() == "the model as built" and off.eager is model
        runner = fastpath.InferenceRunner(model, precision="fp32", batch_size=4, images=10,
                                          device=torch.device("cpu"), fast="eager", cal=cal)
        got = torch.cat([runner(b) for b in x.split(4)])
    runner.finish()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    packed = sum(isinstance(m, cpu_inference.PackedLinear) for m in runner.eager.modules())
    assert runner.describe().startswith("not compiled: turned off; ")
    assert f"{packed} of 9 Linear weights packed" in runner.describe()
    chosen = {e["choice"] for k, e in cal.entries.items() if k.startswith("infer-linear")}  # per shape
    kinds = {"packed" if m.library == "onednn" else "packed-mkl" for m in runner.eager.modules()
             if isinstance(m, cpu_inference.PackedLinear)}
    assert kinds <= chosen and bool(packed) == bool(chosen - {"plain"})
    assert not any(isinstance(m, cpu_inference.PackedLinear) for m in model.modules())  # the model itself: unpacked
    assert runner.measure.uncompiled and not runner.measure.compiled


def test_a_batch_in_pieces_gives_the_whole_batch_outputs_and_attention():
    """`in_pieces` joins the pieces' outputs along the batch: logits, and forward_features' (features, [attention
    per layer]), the same to 1e-5 as the whole batch in one pass."""
    model = _small_model().eval()
    x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(pieces.in_pieces(model, x, 3), model(x), rtol=1e-5, atol=1e-5)  # 3 + 3 + 1
        feats, attns = model.forward_features(x, return_attention=[0, 1])
        got_feats, got_attns = pieces.in_pieces(model.forward_features, x, 2, return_attention=[0, 1])
    torch.testing.assert_close(got_feats, feats, rtol=1e-5, atol=1e-5)
    assert len(got_attns) == 2 and all(g.shape == a.shape == (7, 4, 17, 17) for g, a in zip(got_attns, attns))
    for g, a in zip(got_attns, attns):
        torch.testing.assert_close(g, a, rtol=1e-5, atol=1e-5)
    assert pieces.candidate_sizes(32) == [32, 16, 8, 4, 2, 1] and pieces.candidate_sizes(6) == [6, 4, 2, 1]
    assert pieces.candidate_sizes(1) == [1]


def test_pieces_are_chosen_per_image_by_measurement_and_remembered(tmp_path):
    """The size is measured on the model at each candidate (the batch first, the default), scored per image, kept
    in the calibration and read back; a run too short to repay the measurement, a model that is not a ViT, or a
    batch of one, runs whole batches."""
    cal = Calibration(tmp_path / "cal.json")
    # scoring per item: the default does 4 items in 40 ms (10 ms each), the other 1 in 20 ms: the default stays,
    # where per call (20 < 40 ms) the other would win
    sleeps = {"4": 0.04, "1": 0.02}
    assert cal.choose("per-item", {k: (lambda s=s: time.sleep(s)) for k, s in sleeps.items()},
                      items={"4": 4, "1": 1}) == "4"
    assert cal.get("per-item")["seconds"]["4"] == pytest.approx(0.01, rel=0.5)
    model = _small_model().eval()
    short = pieces.measuring_cost(8) * 10 - 1  # a run too short to repay measuring: whole batches, nothing kept
    assert pieces.choose_pieces(model, precision="fp32", batch_size=8, cal=cal, images=short) == 8
    assert not any(k.startswith("infer-pieces/") for k in cal.entries)
    size = pieces.choose_pieces(model, precision="fp32", batch_size=8, cal=cal, images=short + 1)
    (key, entry), = [(k, e) for k, e in cal.entries.items() if k.startswith("infer-pieces/")]
    assert size == int(entry["choice"]) and set(entry["seconds"]) == {"8", "4", "2", "1"}
    assert key == f"infer-pieces/{compiled.signature(model)}/fp32/t1/b8"
    cal.put(key, {"choice": "2", "seconds": {"8": 1.0, "4": 1.0, "2": 0.5, "1": 1.0}})
    assert pieces.choose_pieces(model, precision="fp32", batch_size=8, cal=cal) == 2  # remembered, not measured
    assert pieces.choose_pieces(model, precision="fp32", batch_size=1, cal=cal) == 1
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert pieces.choose_pieces(cnn, precision="fp32", batch_size=8, cal=cal) == 8
    # a run takes the remembered size: said in its path, the same logits, its compile keyed apart
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        runner = fastpath.InferenceRunner(model, precision="fp32", batch_size=8, images=16,
                                          device=torch.device("cpu"), fast="eager", cal=cal)
        got = torch.cat([runner(b) for b in x.split(8)])
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert runner.pieces == 2 and "2 images at a time" in runner.describe()
    key = runner.measure.key
    assert key.startswith("compile/inference-frozen-cpp/VisionTransformer-") and "-pieces2/fp32/b8/" in key


def test_compiled_piece_size_is_measured_on_the_graph_by_halving_and_a_compiling_run_takes_it(tmp_path):
    """`choose_compiled_pieces` (what `vitlab bench` runs on its compiled model): the batch, then halves while
    a half is faster per image; each size's first call (its compile) is timed; the answer is kept and read
    back without calling the graph. A run that compiles takes that size when its compile record says
    compiling pays; one that does not compile keeps the size measured uncompiled. Here a stand-in for the
    compiled graph sleeps 1.0, 0.6 and 0.8 ms per image at pieces of 8, 4 and 2."""
    cal = Calibration(tmp_path / "cal.json")
    model = _small_model().eval()
    per_image = {8: 1.0e-3, 4: 0.6e-3, 2: 0.8e-3, 1: 0.5e-3}  # 1 would be fastest, but 2 stops the halving
    calls = []

    def graph(x):
        calls.append(len(x))
        time.sleep(per_image[len(x)] * len(x))

    size, first = pieces.choose_compiled_pieces(graph, model, precision="fp32", batch_size=8, cal=cal)
    assert size == 4 and set(calls) == {8, 4, 2} and set(first) == {8, 4, 2}
    assert first[8] == pytest.approx(8e-3, rel=0.5)
    assert pieces.known_compiled_pieces(model, precision="fp32", batch_size=8, cal=cal) == 4
    calls.clear()
    assert pieces.choose_compiled_pieces(graph, model, precision="fp32", batch_size=8, cal=cal) == (4, {})
    assert calls == []
    cal.put(f"infer-pieces/{compiled.signature(model)}/fp32/t1/b8", {"choice": "8", "seconds": {}})
    key = compiled.record_key(model, mode="inference", precision="fp32", batch_size=8, pieces=4)
    cal.put(key, {"compile_s": 1e-3, "compiled_s": 1e-4, "uncompiled_s": 1.0})
    runner = fastpath.InferenceRunner(model, precision="fp32", batch_size=8, images=64, device=torch.device("cpu"),
                                      cal=cal)
    assert runner.compiled is not None and runner.pieces == 4 and runner.measure.key == key
    assert "4 images at a time" in runner.describe()
    eager = fastpath.InferenceRunner(model, precision="fp32", batch_size=8, images=64, device=torch.device("cpu"),
                                     fast="eager", cal=cal)
    assert eager.compiled is None and eager.pieces == 8


def test_every_compile_has_a_graph_cache_of_its_own():
    """Dynamo keeps compiled graphs on the traced code object and stops compiling one that has
    `cache_size_limit` of them, running it uncompiled without a word; `compile_model` gives each model a code
    object of its own, so models compiled past the limit (here 1) are compiled, and each gives its own outputs."""
    from torch._dynamo.utils import counters

    class MLP(torch.nn.Module):  # a model class of one's own (dynamo wraps torch.nn's own forwards in its own
        def __init__(self):  # function, whose cache all of them share)
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch._dynamo.config.patch(cache_size_limit=1):
        for seed in range(3):
            torch.manual_seed(seed)
            mlp = MLP().eval()
            torch.testing.assert_close(compiled.compile_model(mlp, "inference")(x), mlp(x), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 3


def test_bench_races_the_compiled_training_step_of_each_side(monkeypatch):
    """`vitlab bench --train --against timm,compile`: a compiled module keeps its parameters (an optimizer is
    built on it), and the training rows of vitlab, timm and compiled timm come out. The compiler is replaced
    by the function itself here (a training compile takes a minute); other tests compile for real."""
    pytest.importorskip("timm")
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kw: fn)
    model = _small_model()
    net = compiled.compile_model(model, "train")
    assert isinstance(net, torch.nn.Module) and list(net.parameters()) == list(model.parameters())
    rows = bench.bench_model("vit_mini_x", batch_size=2, mode="train", against=["timm", "timm-compile"],
                             matmul_flops={"fp32": 1e9, "bf16": 1e9}, warmup=0, repeats=2)
    assert [r.path for r in rows] == ["vitlab", "timm", "timm-compile"]
    assert rows[0].compile_s is not None and rows[0].vs_best_peer > 0


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available()),
                    reason="inductor packs fp32 Linear weights with oneDNN and MKL; this torch build lacks one")
def test_inference_compile_freezes_the_weights():
    """`compile_model(..., "inference")` freezes for real: inductor gets the weights as constants and packs each
    Linear weight (with torch.compile's options={"freezing": True} alone it packs none: dynamo never sees the
    flag), and the code that calls the kernels is inductor's C++ wrapper, not Python (`cpp_wrapper=False`, the
    bench's compiled-timm peer: Python). The FX graph cache is off, so that the packing happens here and is
    counted even in a torch that learns to cache frozen graphs (2.14 bypasses it for them: packed weights do
    not pickle); its compiled kernels may come from the disk cache."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    for cpp_wrapper in (True, False):
        counters.clear()
        torch._dynamo.reset()
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            got, (code,) = run_and_get_code(compiled.compile_model(mlp, "inference", cpp_wrapper=cpp_wrapper), x)
            torch.testing.assert_close(got, mlp(x), rtol=1e-5, atol=1e-5)
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] == 2
        assert ("CppWrapperCodeCache" in code) == cpp_wrapper and ("def call(" in code) != cpp_wrapper


def test_compiled_inference_equals_eager_and_its_compile_is_remembered(tmp_path):
    """torch.compile with freezing: the same logits to 1e-5 (fp32); a smaller last batch runs uncompiled;
    the compile time and the seconds per image go to the calibration, from which the next run of the same
    model decides at once."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**TINY)).eval()
    torch.nn.init.normal_(model.head.weight, std=0.2)
    cal = Calibration(tmp_path / "cal.json")
    cal.put("compile/inference/another-model/fp32/b2/t1", {"compile_s": 1e-6, "compiled_s": 1.0, "uncompiled_s": 2.0})
    x = torch.randn(9, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
        runner = fastpath.InferenceRunner(model, precision="fp32", batch_size=2, images=9, device=torch.device("cpu"),
                                          cal=cal)
        assert runner.compiled is None  # nothing measured for this model: the first batch is timed uncompiled
        got = torch.cat([runner(b) for b in x.split(2)])  # 2 uncompiled, then 2 + 2 + 2 compiled, 1 uncompiled
    runner.finish()
    assert runner.describe().startswith("compiled (torch.compile, freezing, C++ wrapper): compile time not "
                                        "measured for this model here: expected ~0 s, at most 10% of the run's")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert runner.compiled.shape == (runner.pieces, 3, 16, 16) and len(runner.measure.compiled) == 2
    record = cal.get(runner.measure.key)
    assert set(record) == {"compile_s", "compiled_s", "uncompiled_s"} and record["compiled_s"] > 0
    cal.put(runner.measure.key, {"compile_s": 1.0, "compiled_s": 1e-3, "uncompiled_s": 1.0})
    again = fastpath.InferenceRunner(model, precision="fp32", batch_size=2, images=9, device=torch.device("cpu"),
                                     cal=cal)
    assert again.compiled is not None
    assert again.describe().startswith("compiled (torch.compile, freezing, C++ wrapper): measured here")
    cal.put(runner.measure.key, {"compile_s": 1.0, "compiled_s": 1.0, "uncompiled_s": 1e-3})
    assert fastpath.InferenceRunner(model, precision="fp32", batch_size=2, images=9, device=torch.device("cpu"),
                                    cal=cal).compiled is None  # measured slower here: not compiled


def test_training_compiler_decides_between_epochs_and_measures_the_compile(tmp_path):
    """`fit`'s compile decisions, without compiling: the first epoch runs uncompiled and its step times decide;
    the first compiled epoch's first step, less a compiled step, is the compile time; a compiled model that is
    slower is dropped; a stage with frozen parameters is another graph and another decision."""
    model = _small_model().train()
    cal = Calibration(tmp_path / "cal.json")
    lines = []
    tc = fastpath.TrainingCompiler(model, precision="fp32", batch_size=8, cal=cal, log=lines.append)
    assert tc.model_for(steps_left=100) is model and lines == []  # nothing measured: the first epoch tells
    tc.observe([9.0, 1.0, 1.0, 1.0])
    assert tc.model_for(steps_left=10) is model  # 10 steps x 1 s cannot repay a first compile
    assert lines[-1].startswith("fast path: not compiled: compile time not measured for this model here: "
                                "expected ~120 s, more than 10% of the run's ~10 s")
    tc = fastpath.TrainingCompiler(model, precision="fp32", batch_size=8, cal=cal, log=lines.append)
    tc.observe([9.0, 1.0, 1.0, 1.0])
    net = tc.model_for(steps_left=10 * int(compiled.FIRST_COMPILE_S))
    assert isinstance(net, compiled.CompiledModel) and net.model is model
    tc.observe([50.0, 0.8, 0.8, 0.9])  # the compile, then compiled steps
    assert cal.get(tc.measure.key) == {"compile_s": pytest.approx(49.2), "compiled_s": pytest.approx(0.8),
                                       "uncompiled_s": pytest.approx(1.0)}
    assert tc.model_for(steps_left=100) is net
    tc.observe([1.2, 1.2, 1.3])  # slower than uncompiled after all: dropped
    assert tc.model_for(steps_left=100) is model and "not faster here" in lines[-1]
    model.head.weight.requires_grad_(False)
    tc.model_for(steps_left=100)
    assert "-partly-frozen/" in tc.measure.key and tc.compiled is None
    off = fastpath.TrainingCompiler(model, precision="fp32", batch_size=8, fast="eager", cal=cal)
    off.observe([1.0] * 3)
    assert off.model_for(steps_left=10**9) is model


@pytest.mark.slow  # compiles a training graph (forward and backward): about a minute on 2 busy cores
def test_fit_compiled_trains_as_uncompiled(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(24, 3, 16, 16), torch.arange(24) % 5
    recipe = Recipe(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0)
    rows = {}
    for fast in ("off", "compile"):
        torch.manual_seed(0)
        model = VisionTransformer(ViTConfig(**TINY))
        lines = []
        history = fit(model, TensorLoader(x, y, batch_size=8), TensorLoader(x, y, batch_size=8), recipe,
                      device="cpu", log=lines.append, fast_path=fast)
        rows[fast] = history.rows
        if fast == "compile":
            assert any(line.startswith("fast path: compiled (torch.compile): asked for") for line in lines)
    for a, b in zip(rows["off"], rows["compile"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)


def test_predict_prints_the_path_taken_and_each_path_gives_the_same_predictions(tmp_path, capsys):
    """`vitlab predict`: one image runs the model as built; many run the measured kernels (`eager` here, so
    that nothing compiles), with the same probabilities to 1e-5; `--fast-path off` turns it all off."""
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=10)
    torch.nn.init.normal_(model.head.weight, std=0.2)
    export_model(model, tmp_path / "m.safetensors")
    g = torch.Generator().manual_seed(0)
    images = []
    for i in range(5):
        path = tmp_path / f"{i}.png"
        Image.fromarray((torch.rand(40, 40, 3, generator=g) * 255).byte().numpy()).save(path)
        images.append(str(path))
    common = ["--checkpoint", str(tmp_path / "m.safetensors"), "--json", "--device", "cpu", "--batch-size", "2"]
    outputs = {}
    for fast in ("off", "eager"):
        assert main(["predict", *images, *common, "--fast-path", fast]) == 0
        out, err = capsys.readouterr()
        outputs[fast] = json.loads(out)["results"]
        (line,) = [line for line in err.splitlines() if line.startswith("fast path:")]
        if fast == "off":
            assert line == "fast path: the model as built"
        else:
            assert line.startswith("fast path: not compiled: turned off; ") and "Linear weights packed" in line
    for a, b in zip(outputs["off"], outputs["eager"]):
        assert [p["index"] for p in a["predictions"]] == [p["index"] for p in b["predictions"]]
        assert max(abs(p["prob"] - q["prob"]) for p, q in zip(a["predictions"], b["predictions"])) <= 1e-5
    assert main(["predict", images[0], *common]) == 0
    assert "fast path: the model as built (one batch: preparing a faster path would cost more than it saves)" in \
        capsys.readouterr().err
