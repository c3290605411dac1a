"""The fast paths compute what the model as built computes, are chosen by fixed rules (never by a clock),
leave the caller's model as it was, keep their state under vitlab's cache root, and `vitlab bench` reports
sane rows.

No timing is asserted here (machines differ): speed figures live in `vitlab bench`, `vitlab tune` and
benchmarks/. Where a test needs a measurement, the clock is replaced by a fake one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from vitlab import bench, options
from vitlab.analysis import attention, plots
from vitlab.analysis.flops import count_macs
from vitlab.cli import build_parser, main
from vitlab.errors import VitlabError
from vitlab.fileio import cache_root
from vitlab.inference.export import export_model
from vitlab.inference.predict import predict_files
from vitlab.models.factory import create_model
from vitlab.models.registry import get_config
from vitlab.models.size import estimate_memory
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.runtime import num_threads
from vitlab.serve.models import LoadedModel, ModelStore
from vitlab.speed import compiled, fastpath, onednn, paths, rules, tune
from vitlab.speed.machine import Machine, kind_of, this_machine
from vitlab.speed.paths import inference_fn
from vitlab.speed.rules import Plan
from vitlab.train.engine import TensorLoader, fit
from vitlab.train.job import TrainJob
from vitlab.train.recipe import Recipe

SMALL = dict(img_size=32, patch_size=8, dim=64, depth=2, heads=4, num_classes=10)
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not onednn.available("fp32"), reason="this torch build has no oneDNN")


def _small_model(seed: int = 0, **overrides) -> VisionTransformer:
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**{**SMALL, **overrides}))
    torch.nn.init.normal_(model.head.weight, std=0.2)  # a non-zero head: logits that depend on the image
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with num_threads(1):  # small tensors: threads only add contention on a shared machine
        yield


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache root of each test's own: no test reads what another tuned."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=1) / b.norm(dim=1)


def _machine(vendor: str, *flags: str) -> Machine:
    return Machine(cpu=f"a {vendor} CPU", vendor=vendor, kind=kind_of(frozenset(flags)), flags=frozenset(flags))


AMD_ZEN5 = _machine("amd", "avx2", "fma", "avx512f", "avx512_bf16")
AMD_EPYC_AVX2 = _machine("amd", "avx2", "fma")
XEON_AMX = _machine("intel", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
VIT_S = 9.2e9  # forward FLOPs per image of ViT-S/16


# ----------------------------------------------------------------------------------------------------
# The rules: a plan is a function of what the machine is and of the run, nothing else


def test_the_machine_kind_is_read_from_its_flags():
    assert [m.kind for m in (AMD_ZEN5, AMD_EPYC_AVX2, XEON_AMX)] == ["avx512-bf16", "avx2", "amx"]
    assert kind_of(frozenset({"avx512f", "avx2", "fma"})) == "avx512" and kind_of(frozenset({"neon"})) == "other"
    here = this_machine()
    assert here.kind in ("amx", "avx512-bf16", "avx512", "avx2", "other") and here.vendor in ("intel", "amd", "other")
    assert this_machine() is here  # read once per process
    assert torch.__version__.split("+")[0] in here.slug and "/" not in here.slug


def test_the_rules_send_each_cpu_kind_where_its_measurements_say():
    """One table (`vitlab.speed.rules.RULES`): AMD infers on weights packed for oneDNN (compiled over them for a
    long run, in fp32 from batch 2 and only on the kind measured: AVX-512 with bf16), and trains fp32 as built;
    an Intel Xeon with AMX compiles a long inference run, a few images at a time, and trains bf16 on the
    explicit attention products; a small model, a short run or a GPU runs as built."""

    def plan(machine, mode="inference", precision="fp32", batch=32, flops=VIT_S, items=10**6, device="cpu"):
        return rules.plan_by_rules(
            machine,
            mode=mode,
            precision=precision,
            batch_size=batch,
            flops_per_item=flops,
            items=items,
            device_type=device,
        )

    for amd in (AMD_ZEN5, AMD_EPYC_AVX2):
        p = plan(amd, batch=1)
        assert (p.products, p.compile, p.attention) == ("onednn", False, "fused"), amd.kind
    assert plan(AMD_ZEN5).compile and not plan(AMD_EPYC_AVX2).compile  # fp32 compiles from batch 2 where measured
    assert plan(AMD_ZEN5).pieces == 0 and not plan(AMD_ZEN5, items=100).compile
    for amd in (AMD_ZEN5, AMD_EPYC_AVX2):
        assert plan(amd, "train") == Plan(source=f"rules ({amd.kind}, amd)")  # training: as built
    assert plan(AMD_ZEN5, "train", "bf16").attention == plan(AMD_ZEN5, "inference", "bf16").attention == "explicit"
    assert plan(AMD_ZEN5, "inference", "bf16").compile and not plan(AMD_ZEN5, "inference", "bf16", items=10).compile
    long = plan(XEON_AMX)
    assert (long.products, long.compile, long.pieces) == ("aten", True, 4) and long.source == "rules (amx, intel)"
    assert plan(XEON_AMX, batch=4).pieces == 0  # no pieces of a batch as small as a piece
    short = plan(XEON_AMX, items=100)  # 100 ViT-S/16 images do not repay a compile
    assert not short.compile and short.pieces == 0
    assert plan(XEON_AMX, items=int(rules.COMPILE_FLOPS / VIT_S) + 1).compile
    assert plan(XEON_AMX, "inference", "bf16").pieces == 16 and plan(XEON_AMX, "train", "bf16").attention == "explicit"
    assert not plan(XEON_AMX, "train").compile  # a ViT's training never compiles by the rules
    for machine in (AMD_ZEN5, XEON_AMX, _machine("other", "neon")):
        assert (
            plan(machine, flops=rules.SMALL_FLOPS / 2)
            .describe()
            .startswith("fused attention, torch's products, not compiled [rules")
        )
        assert plan(machine, device="cuda") == Plan(source="rules (cuda)")
    assert rules.RULES[-1] == rules.Rule("*", "*", "*", "*", family="*")  # every machine, mode, precision, model


def test_a_cnns_long_training_compiles_where_measured_and_nowhere_else():
    """A CNN's rows count steps: on AMD with AVX-512 and bf16 (where a compiled step of `resnet_mini` ran 1.45x the
    eager one) its training compiles from CNN_COMPILE_STEPS steps on; its inference, a short run, another CPU kind,
    bf16 or a GPU run it as built; fit trains the CNN on that plan and says where it came from."""

    def plan(machine, mode="train", precision="fp32", items=10_000, device="cpu", family="cnn"):
        return rules.plan_by_rules(
            machine,
            mode=mode,
            precision=precision,
            batch_size=64,
            flops_per_item=0.0,
            items=items,
            device_type=device,
            family=family,
        )

    assert plan(AMD_ZEN5) == Plan(compile=True) and plan(AMD_ZEN5).source == "rules (avx512-bf16, amd): a CNN"
    assert plan(AMD_ZEN5, items=rules.CNN_COMPILE_STEPS).compile
    assert not plan(AMD_ZEN5, items=rules.CNN_COMPILE_STEPS - 1).compile  # too short to repay the compile
    for kw in ({"mode": "inference"}, {"precision": "bf16"}, {"device": "cuda"}, {"family": "vit"}):
        assert not plan(AMD_ZEN5, **kw).compile, kw
    for machine in (AMD_EPYC_AVX2, XEON_AMX, _machine("other", "neon")):
        assert not plan(machine).compile, machine.kind
    with pytest.raises(ValueError, match="family must be one of"):
        plan(AMD_ZEN5, family="rnn")
    cnn, vit = create_model("resnet_mini", num_classes=10), create_model("vit_mini", num_classes=10)
    assert (paths.family(cnn), paths.family(vit)) == ("cnn", "vit")
    chosen = fastpath.choose_plan(
        cnn, fast="auto", mode="train", precision="fp32", batch_size=64, items=10_000, device=torch.device("cpu")
    )
    assert chosen.compile == (this_machine().vendor == "amd" and this_machine().kind == "avx512-bf16")


def test_a_plan_reads_back_and_refuses_what_is_not_a_plan():
    plan = Plan("explicit", "onednn", True, 4, "tuned")
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    for bad in ({"attention": "flash"}, {"pieces": -1}, {"compile": "yes"}, {"extra": 1}, [1, 2]):
        with pytest.raises(ValueError):
            Plan.from_dict({**plan.to_dict(), **bad} if isinstance(bad, dict) else bad)


def test_a_plans_source_says_where_it_came_from_and_is_left_out_of_equality():
    tuned, rules_ = Plan("explicit", "onednn", True, 4, "tuned"), Plan("explicit", "onednn", True, 4, "rules (x)")
    assert tuned == rules_ and hash(tuned) == hash(rules_) and tuned.describe() != rules_.describe()
    assert tuned != Plan("fused", "onednn", True, 4, "tuned") and Plan(source="--fast-path off") == rules.AS_BUILT
    assert {tuned, rules_} == {tuned}  # a set of plans holds each way of running once


def test_a_fast_path_is_a_word_a_plan_or_none_and_auto_is_the_one_default():
    model = _small_model()
    kw = dict(mode="inference", precision="fp32", batch_size=4, items=1, device=CPU)
    given = Plan("explicit", source="mine")
    assert fastpath.choose_plan(model, fast=given, **kw) == given  # taken as it is
    assert fastpath.choose_plan(model, fast=None, **kw) == rules.AS_BUILT
    assert fastpath.choose_plan(model, fast="off", **kw).source == "--fast-path off"
    assert options.DEFAULT_FAST_PATH == "auto" and options.DEFAULT_FAST_PATH in options.FAST_PATHS
    with pytest.raises(VitlabError, match=r"fast_path must be one of auto, .* found 'fast'"):
        fastpath.choose_plan(model, fast="fast", **kw)


def test_every_command_and_function_that_runs_a_model_takes_the_one_default_fast_path():
    default = options.DEFAULT_FAST_PATH
    takers = [fit, TrainJob, predict_files, plots.write_figure7, ModelStore, LoadedModel]
    takers += [fastpath.InferenceRunner, fastpath.serving_model]
    takers += [attention.iter_attention, attention.cls_attention, attention.rollout]
    takers += [attention.explain, attention.mean_attention_distance]
    for taker in takers:
        params = inspect.signature(taker).parameters
        assert params["fast_path" if "fast_path" in params else "fast"].default == default, taker
    assert inspect.signature(bench.bench_model).parameters["fast_paths"].default == (default,)
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    flags = {name: p.get_default("fast_path") for name, p in commands.items() if p.get_default("fast_path")}
    assert {"train", "finetune", "predict", "attention", "inspect", "serve", "reproduce", "bench"} <= set(flags)
    assert all(flag in (default, [default]) for flag in flags.values()), flags


# ----------------------------------------------------------------------------------------------------
# What each path computes


@needs_onednn
def test_onednn_packed_products_are_torchs_to_float_rounding():
    """Packed once for inference: fp32 to 1e-5, bf16 bitwise autocast's product; a packed copy of a ViT has
    no nn.Linear left, its MLP's GELU runs inside fc1's kernel, and the model copied is left as it was."""
    lin = torch.nn.Linear(96, 288)
    x = torch.randn(2, 17, 96, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(onednn.PackedLinear(lin, torch.float32, 34)(x), lin(x), rtol=1e-5, atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if onednn.available("bf16"):
                assert torch.equal(onednn.PackedLinear(lin, torch.bfloat16, 34)(x), lin(x))
        fused = onednn.PackedLinear(lin, torch.float32, 34, gelu="none")(x)
        torch.testing.assert_close(fused, F.gelu(lin(x)), rtol=1e-5, atol=1e-5)
    model = _small_model().eval()
    packed = onednn.packed_copy(model, "fp32", 17)
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    assert isinstance(packed.blocks[0].mlp.act, torch.nn.Identity) and packed.blocks[0].mlp.fc1.post_op == "gelu"
    assert isinstance(model.blocks[0].mlp.act, torch.nn.GELU) and type(model.head) is torch.nn.Linear
    for batch in (1, 5):  # other row counts than the one packed for
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "plan", [Plan("explicit", "aten"), Plan("fused", "onednn"), Plan("explicit", "onednn", pieces=3)]
)
def test_an_inference_plan_gives_the_models_logits_and_leaves_the_model_as_it_was(plan):
    if plan.products == "onednn" and not onednn.available("fp32"):
        pytest.skip("this torch build has no oneDNN")
    model = _small_model().eval()
    before = {n: p.clone() for n, p in model.state_dict().items()}
    modules = [type(m) for m in model.modules()]
    x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    fn = inference_fn(model, plan, precision="fp32", batch_size=7)
    with torch.inference_mode():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        feats, attns = inference_fn(model, plan, precision="fp32", batch_size=7, method="forward_features")(
            x, return_attention=[0, 1]
        )
        ref_feats, ref_attns = model.forward_features(x, return_attention=[0, 1])
    torch.testing.assert_close(feats, ref_feats, rtol=1e-5, atol=1e-5)
    for a, b in zip(attns, ref_attns):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [type(m) for m in model.modules()] == modules and all(b.attn.fused for b in model.blocks)
    assert all(torch.equal(p, before[n]) for n, p in model.state_dict().items())
    assert inference_fn(model, Plan(source="rules"), precision="fp32", batch_size=7) == model.forward  # nothing to do


def test_fit_trains_on_a_plan_and_gives_the_model_back_as_it_came(tmp_path):
    """A tuned plan (written here, as `vitlab tune` would keep it) with the explicit attention products: the
    model trains through it, its modules, Parameter objects and attention kernel are those it came with, the
    plan is said, kept in the History and in every checkpoint, and a resumed run takes the plan it was started
    with, whatever the fast path asked for now. The losses equal the model as built's to float rounding."""
    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = torch.arange(32) % 10
    recipe = Recipe(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, seed=3)
    tuned = Plan("explicit", source="tuned")
    histories = {}
    for fast in ("off", "tuned"):
        model = _small_model()
        tune.remember(model, mode="train", precision="fp32", batch_size=8, plan=tuned)
        params = [id(p) for p in model.parameters()]
        modules = [type(m) for m in model.modules()]
        lines = []
        histories[fast] = fit(
            model,
            TensorLoader(x, y, batch_size=8, shuffle=True),
            TensorLoader(x, y, batch_size=8),
            recipe,
            device="cpu",
            log=lines.append,
            fast_path=fast,
            out=tmp_path / fast,
        )
        assert [id(p) for p in model.parameters()] == params and [type(m) for m in model.modules()] == modules
        assert all(b.attn.fused for b in model.blocks)
        plan = tuned if fast == "tuned" else Plan(source="--fast-path off")
        assert histories[fast].plan == plan and f"fast path: {plan.describe()}" in lines
        state = torch.load(tmp_path / fast / "checkpoints" / "epoch_0002" / "state.pt", weights_only=True)
        assert Plan.from_dict(state["plan"]) == plan
    for a, b in zip(histories["off"].rows, histories["tuned"].rows):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    lines = []
    model = _small_model()
    fit(
        model,
        TensorLoader(x, y, batch_size=8, shuffle=True),
        TensorLoader(x, y, batch_size=8),
        recipe,
        device="cpu",
        log=lines.append,
        fast_path="off",
        out=tmp_path / "tuned",
        resume=True,
    )
    assert f"fast path: the run's own, as it was started ({tuned.describe()})" in lines


# ----------------------------------------------------------------------------------------------------
# Same command, seed and data: bitwise the same run, whatever the cache held and whoever ran first


def _train_argv(data: Path, out: Path) -> list[str]:
    return [
        "train",
        "--data",
        str(data),
        "--model",
        "vit_mini",
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--threads",
        "1",
        "--out",
        str(out),
    ]


def _weights(run: Path) -> dict:
    return load_file(run / "checkpoints" / "epoch_0001" / "model.safetensors")


def test_the_same_training_is_bitwise_the_same_with_an_empty_cache_an_opposite_one_and_side_by_side(tmp_path):
    """The quick start's `vitlab train` three ways: as two processes side by side, each starting with an empty
    cache root; and in this process, with a cache holding the opposite choices (a tuned plan with the other
    attention kernel, compiled, which `auto` does not read). Every run's weights are bitwise the same."""
    data = tmp_path / "digits"
    assert main(["data", "digits", "--out", str(data), "--per-class", "20", "--size", "16"]) == 0
    env = {**os.environ, "VITLAB_CACHE": str(tmp_path / "fresh")}
    side = [
        subprocess.Popen(
            [sys.executable, "-m", "vitlab", *_train_argv(data, tmp_path / f"side{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    model = create_model("vit_mini", num_classes=10, img_size=16)
    opposite = Plan("explicit", compile=True, source="tuned")
    with num_threads(1):
        tune.remember(model, mode="train", precision="fp32", batch_size=64, plan=opposite)
    assert tune.read_entries()  # the session's cache root now holds the opposite choice
    assert main(_train_argv(data, tmp_path / "b")) == 0
    for proc in side:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "fast path: fused attention, torch's products, not compiled [rules" in out
    assert not (tmp_path / "fresh" / "tuning").exists()  # nothing was measured
    ref = _weights(tmp_path / "side0")
    for run in ("b", "side1"):
        got = _weights(tmp_path / run)
        assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref), run
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert Plan.from_dict(summary["fast_path"]).source.startswith("rules (")


@pytest.mark.slow  # a minute on 2 cores: two processes compile the CNN's forward and backward
def test_a_compiled_cnns_training_is_bitwise_the_same_with_inductors_cache_empty_or_full(tmp_path):
    """The CNN's compiled training (the rules' path for a long run on AMD with AVX-512 and bf16; asked for here, so on
    any CPU): two processes one after the other on one cache root, the first compiling into an empty inductor cache,
    the second reading it, train bitwise the same weights."""
    data = tmp_path / "digits"
    assert main(["data", "digits", "--out", str(data), "--per-class", "10", "--size", "16"]) == 0
    env = {**os.environ, "VITLAB_CACHE": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    for run in ("cold", "warm"):
        argv = [*_train_argv(data, tmp_path / run), "--model", "resnet_mini", "--batch-size", "16"]
        done = subprocess.run(
            [sys.executable, "-m", "vitlab", *argv, "--fast-path", "compile"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        assert "compiled" in done.stdout and "not compiled" not in done.stdout
    assert any((tmp_path / "cache" / "inductor").iterdir())  # the first process filled the cache the second read
    cold, warm = _weights(tmp_path / "cold"), _weights(tmp_path / "warm")
    assert cold.keys() == warm.keys() and all(torch.equal(cold[k], warm[k]) for k in cold)


# ----------------------------------------------------------------------------------------------------
# Tuning: an explicit step, kept under the cache root, read back


def test_tuning_measures_the_candidates_keeps_the_fastest_and_is_read_back(monkeypatch):
    """`tune` races the eager candidates, then the fastest compiled; the clock is a fake one here, so the
    outcome is set by the test: the explicit attention products win by 10% over the rules' plan. The plan
    goes to the tuning file under the cache root, `known` and `--fast-path tuned` read it back, and a
    candidate within `MARGIN` of the rules' plan does not replace it."""
    model = _small_model(seed=1)
    winner = Plan("explicit", source="tuned")
    speeds = {winner.describe(): 0.9}  # seconds per call; every other candidate: 1.0

    def fake_race(fns, **kwargs):
        return {name: [speeds.get(name, 1.0)] * 3 for name in fns}

    monkeypatch.setattr(tune, "race", fake_race)
    monkeypatch.setattr(tune, "_step", lambda *args: (lambda: None, contextlib.ExitStack()))
    default = Plan(source="rules (test)")
    plan = tune.tune(model, mode="train", precision="fp32", batch_size=4, default=default)
    assert plan == winner
    assert tune.tuning_file().is_relative_to(cache_root()) and tune.tuning_file().parent.name == "tuning"
    assert tune.known(model, mode="train", precision="fp32", batch_size=4) == plan
    assert tune.known(model, mode="train", precision="fp32", batch_size=8) is None  # another batch: not tuned
    assert (
        fastpath.choose_plan(model, fast="tuned", mode="train", precision="fp32", batch_size=4, items=1, device=CPU)
        == plan
    )
    speeds[winner.describe()] = 0.98  # within the margin: the rules' plan stays
    assert tune.tune(model, mode="train", precision="fp32", batch_size=2, default=default) == Plan(source="tuned")
    entry = tune.read_entries()[tune.key(model, mode="train", precision="fp32", batch_size=2)]
    assert entry["rules"] == default.to_dict() and len(entry["seconds_per_image"]) == 3  # 2 eager, 1 compiled
    assert fastpath.choose_plan(
        model, fast="tuned", mode="inference", precision="fp32", batch_size=8, items=1, device=CPU
    ).products in ("aten", "onednn")  # tuned now: inference has 4 candidates
    entry = tune.read_entries()[tune.key(model, mode="inference", precision="fp32", batch_size=8)]
    assert len(entry["seconds_per_image"]) == 2 * (1 + onednn.available("fp32")) + 1 + 1  # eager, compiled, pieces 4


def test_training_tunes_at_the_batch_the_data_gives_not_a_larger_recipe_batch(monkeypatch):
    """A batch of 5,000 on 6 images trains in batches of 6: tuning at 5,000 would time compiled candidates on
    batches no step ever sees (for minutes before the first step)."""
    from torch.utils.data import DataLoader, TensorDataset

    from vitlab.train import Recipe, fit

    timed = []

    def step(model, plan, mode, precision, x, y):
        timed.append(len(x))
        return lambda: None, contextlib.ExitStack()

    monkeypatch.setattr(tune, "race", lambda fns, **kw: {name: [1.0] * 3 for name in fns})
    monkeypatch.setattr(tune, "_step", step)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(6, 3, 32, 32, generator=g), torch.arange(6) % 10)
    train, val = DataLoader(data, batch_size=5000, shuffle=False), DataLoader(data, batch_size=6)
    fit(_small_model(), train, val, Recipe(epochs=1, batch_size=5000), device="cpu", fast_path="tuned")
    assert timed and set(timed) == {6}
    keys = [tune.key(_small_model(), mode="train", precision="fp32", batch_size=b) for b in (6, 5000)]
    assert keys[0] in tune.read_entries() and keys[1] not in tune.read_entries()


def test_the_tuning_file_takes_writers_from_many_threads_at_once():
    """`vitlab serve` readies models on several threads: every plan written at once is kept, and the file stays
    whole JSON."""
    models = [_small_model(seed=s, depth=1 + s % 3) for s in range(8)]
    errors = []

    def write(i: int) -> None:
        try:
            for b in range(1, 6):
                tune.remember(models[i], mode="inference", precision="fp32", batch_size=b, plan=Plan(pieces=b))
        except Exception as e:  # pragma: no cover - the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for m, b in itertools.product(models, range(1, 6)):
        assert tune.known(m, mode="inference", precision="fp32", batch_size=b) == Plan(pieces=b)


def test_a_foreign_or_torn_tuning_file_is_not_read(monkeypatch):
    model = _small_model()
    tune.remember(model, mode="inference", precision="fp32", batch_size=3, plan=Plan(pieces=1))
    path = tune.tuning_file()
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "cpu": "another CPU"}))
    assert tune.known(model, mode="inference", precision="fp32", batch_size=3) is None
    path.write_text(path.read_text()[:20])
    assert tune.known(model, mode="inference", precision="fp32", batch_size=3) is None
    path.unlink()


def test_a_tuning_file_that_is_a_device_or_too_large_is_not_read_and_a_wild_entry_is_refused():
    """A link to /dev/zero would be read until memory ran out; an entry asking for 10**9 images per piece, or
    whose `source` would print a newline and a terminal escape, is no plan."""
    model = _small_model()
    tune.remember(model, mode="inference", precision="fp32", batch_size=3, plan=Plan(pieces=1))
    path = tune.tuning_file()
    good = json.loads(path.read_text())
    key = tune.key(model, mode="inference", precision="fp32", batch_size=3)
    try:
        path.unlink()
        path.symlink_to("/dev/zero")
        assert tune.read_entries() == {} and tune.known(model, mode="inference", precision="fp32", batch_size=3) is None
        path.unlink()
        path.write_text(json.dumps(good) + " " * tune.MAX_FILE_BYTES)  # well-formed, but past the cap
        assert tune.read_entries() == {}
        for wild in ({"pieces": 10**9}, {"pieces": True}, {"source": "tuned\n\x1b[31mred"}, {"source": "x" * 201}):
            entry = {**good["entries"][key], "plan": {**good["entries"][key]["plan"], **wild}}
            path.write_text(json.dumps({**good, "entries": {key: entry}}))
            assert tune.known(model, mode="inference", precision="fp32", batch_size=3) is None, wild
            with pytest.raises(ValueError, match="not a plan"):
                Plan.from_dict(entry["plan"])
        path.write_text(json.dumps(good))
        assert tune.known(model, mode="inference", precision="fp32", batch_size=3) == Plan(pieces=1)
    finally:
        path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------
# Commands: each says its plan; every path gives the same predictions


def test_predict_says_its_plan_and_each_path_gives_the_same_predictions(tmp_path, capsys):
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
    tuned = Plan("explicit", "onednn" if onednn.available("fp32") else "aten", pieces=1, source="tuned")
    tune.remember(model, mode="inference", precision="fp32", batch_size=2, plan=tuned)
    common = ["--checkpoint", str(tmp_path / "m.safetensors"), "--json", "--device", "cpu", "--batch-size", "2"]
    outputs = {}
    for fast in ("off", "auto", "tuned"):
        assert main(["predict", *images, *common, "--fast-path", fast]) == 0
        out, err = capsys.readouterr()
        outputs[fast] = json.loads(out)["results"]
        (line,) = [line for line in err.splitlines() if line.startswith("fast path:")]
        assert (
            line
            == "fast path: "
            + {
                "off": Plan(source="--fast-path off").describe(),
                "tuned": tuned.describe(),
                "auto": f"fused attention, torch's products, not compiled [rules ("
                f"{this_machine().kind}, {this_machine().vendor}): a small model]",
            }[fast]
        )
    for fast in ("auto", "tuned"):
        for a, b in zip(outputs["off"], outputs[fast]):
            assert [p["index"] for p in a["predictions"]] == [p["index"] for p in b["predictions"]]
            assert max(abs(p["prob"] - q["prob"]) for p, q in zip(a["predictions"], b["predictions"])) <= 1e-5


def test_servers_ready_their_models_on_many_threads_at_once():
    """`serving_model` from several threads at once (as `vitlab serve` readies each model it loads): each copy
    computes its own model's logits, and no model handed in changes."""
    models = [_small_model(seed=s).eval() for s in range(6)]
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    results = [None] * len(models)

    def ready(i: int) -> None:
        fn, said = fastpath.serving_model(models[i], precision="fp32", device=CPU, fast="eager")
        with torch.inference_mode():
            results[i] = (fn(x), said)

    threads = [threading.Thread(target=ready, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, (logits, said) in zip(models, results):
        with torch.inference_mode():
            torch.testing.assert_close(logits, model(x), rtol=1e-5, atol=1e-5)
        assert "not compiled" in said


# ----------------------------------------------------------------------------------------------------
# torch.compile: what it computes


def test_compiled_inference_freezes_and_each_model_keeps_its_own_weights():
    """`compile_model(..., "inference")` freezes for real (inductor packs every Linear weight: with
    torch.compile's options={"freezing": True} alone it packs none) and calls its kernels from its C++ wrapper
    (`cpp_wrapper=False`: Python, the bench's compiled-timm peer). Three models of one class compiled in one
    process each give their own outputs (frozen weights are constants of their own graph)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    torch.compiler.reset()
    for cpp_wrapper, seed in ((True, 0), (False, 1), (True, 2)):
        torch.manual_seed(seed)
        mlp = MLP().eval()
        counters.clear()
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            got, (code,) = run_and_get_code(compiled.compile_model(mlp, "inference", cpp_wrapper=cpp_wrapper), x)
            torch.testing.assert_close(got, mlp(x), rtol=1e-5, atol=1e-5)
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] == 2
        assert ("CppWrapperCodeCache" in code) == cpp_wrapper and ("def call(" in code) != cpp_wrapper
    torch.compiler.reset()


def test_a_compiled_model_runs_other_shapes_uncompiled_and_a_batch_in_pieces_is_the_whole_batch():
    model = _small_model().eval()
    x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(compiled.in_pieces(model, x, 3), model(x), rtol=1e-5, atol=1e-5)  # 3 + 3 + 1
        assert compiled.in_pieces(model, x, 0).shape == (7, 10)
    calls = []
    wrapper = compiled.CompiledModel.__new__(compiled.CompiledModel)
    torch.nn.Module.__init__(wrapper)
    wrapper.model, wrapper.method, wrapper.shape = model, "forward", None
    wrapper.compiled = lambda x: calls.append(x.shape) or model(x)  # the graph, stood in for
    with torch.no_grad():
        wrapper(x[:4]), wrapper(x[:4]), wrapper(x[:3])
    assert calls == [(4, 3, 32, 32)] * 2  # the smaller last batch ran uncompiled


# ----------------------------------------------------------------------------------------------------
# The model's own fast and readable paths


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


@pytest.mark.parametrize(
    "overrides", [{}, {"pos_embed": "relative"}, {"pos_embed": "learned2d"}, {"pool": "mean", "class_token": False}]
)
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


# ----------------------------------------------------------------------------------------------------
# vitlab bench


def test_race_alternates_and_repeats_a_short_call_to_fill_a_repeat():
    """The order flips every repeat; a call shorter than `min_repeat_s` is repeated within a repeat (by a fake
    clock here: one tick per call of "fast", ten per call of "slow")."""
    calls, now = [], [0.0]

    def clock() -> float:
        return now[0]

    def fn(name: str, ticks: int):
        def call() -> None:
            calls.append(name)
            now[0] += ticks

        return call

    times = tune.race({"a": fn("a", 1), "b": fn("b", 1)}, warmup=1, repeats=3, clock=clock)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then the order flips each repeat
    assert times == {"a": [1.0] * 3, "b": [1.0] * 3}
    calls.clear()
    times = tune.race({"slow": fn("s", 10), "fast": fn("f", 1)}, warmup=1, repeats=2, min_repeat_s=10, clock=clock)
    assert calls.count("s") == 1 + 2 and calls.count("f") == 1 + 2 * 10
    assert times == {"slow": [10.0, 10.0], "fast": [1.0, 1.0]}


def test_timm_twin_has_the_same_weights_and_logits():
    pytest.importorskip("timm")
    model = _small_model().eval()
    twin = bench.timm_twin(model).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-5)


def test_memory_estimate_orders_the_runs():
    cfg = get_config("vit_base_patch16_224")
    plain = estimate_memory(cfg, 16, train=True)
    ckpt = estimate_memory(cfg, 16, train=True, grad_checkpointing=True)
    infer = estimate_memory(cfg, 1, train=False)
    assert plain["weights"] == 86_567_656 * 4  # ViT-B/16's parameters, fp32
    assert plain["total"] == sum(v for k, v in plain.items() if k != "total")
    assert ckpt["activations"] < 0.3 * plain["activations"]
    assert infer["total"] < 1.5 * infer["weights"]
    assert estimate_memory(cfg, 16, precision="bf16")["activations"] < plain["activations"]


def test_measured_peak_memory_of_inference_is_near_the_weights():
    out = bench.measure_peak_memory("vit_tiny_patch16_224", 1, train=False, threads=1)
    assert out["weights_bytes"] == 5_717_416 * 4
    assert estimate_memory(get_config("vit_tiny_patch16_224"), 1, train=False)["weights"] == out["weights_bytes"]
    assert out["weights_bytes"] <= out["peak_bytes"] < out["weights_bytes"] + 200 * 2**20


def test_bench_cli_quick_json(capsys):
    """`vitlab bench --json`: one object per measurement, every path on the same batch, each of vitlab's rows
    saying its plan; vitlab's ratio to the fastest peer is the median of its back-to-back pairs; ONNX Runtime
    rows for fp32 inference only; `--fast-path auto tuned` adds the tuned plan's row."""
    pytest.importorskip("timm")
    pytest.importorskip("onnxruntime")
    model = create_model("vit_mini_x")
    tuned = Plan("explicit", "aten", source="tuned")
    with num_threads(1):
        for mode, precision in itertools.product(("inference", "train"), ("fp32", "bf16")):
            tune.remember(model, mode=mode, precision=precision, batch_size=2, plan=tuned)
    code = main(
        [
            "bench",
            "--quick",
            "--json",
            "--train",
            "--against",
            "timm,onnxruntime",
            "--repeats",
            "3",
            "--warmup",
            "0",
            "--matmul-size",
            "64",
            "--batch-size",
            "2",
            "--threads",
            "1",
            "--precision",
            "fp32",
            "bf16",
            "--fast-path",
            "auto",
            "tuned",
        ]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    by = {(r["mode"], r["precision"], r["path"]): r for r in rows}
    expected = {
        (m, p, path)
        for m in ("inference", "train")
        for p in ("fp32", "bf16")
        for path in ("vitlab", "vitlab-tuned", "timm")
    } | {("inference", "fp32", "onnxruntime")}
    assert set(by) == expected
    for r in rows:
        assert r["model"] == "vit_mini_x" and r["batch"] == 2 and r["threads"] == 1
        assert r["images_per_s"] == pytest.approx(2 / r["seconds"])
        assert r["seconds"] == pytest.approx(statistics.median(r["repeats"]))
        flops = count_macs(get_config("vit_mini_x")).flops * 2 * (3 if r["mode"] == "train" else 1)
        assert r["flops_per_s"] == pytest.approx(flops / r["seconds"])
        if r["path"].startswith("vitlab"):
            peers = [p for (m, pr, p) in by if (m, pr) == (r["mode"], r["precision"]) and not p.startswith("vitlab")]
            assert r["vs_best_peer"] == pytest.approx(
                min(bench.paired_ratio(r["repeats"], by[(r["mode"], r["precision"], p)]["repeats"]) for p in peers)
            )
        else:
            assert r["vs_best_peer"] is None
    assert by[("inference", "fp32", "vitlab")]["how"].endswith("a small model]")  # vit_mini_x: as built
    assert by[("train", "fp32", "vitlab-tuned")]["how"] == tuned.describe()
    assert by[("inference", "fp32", "timm")]["how"] == "as shipped"


def test_bench_cli_errors_are_one_line(capsys):
    assert main(["bench", "--model", "resnet_mini", "--quick", "--repeats", "1", "--matmul-size", "32"]) == 2
    assert "CNN baseline" in capsys.readouterr().err
    assert (
        main(
            ["bench", "--model", "vit_mini_x", "--against", "timm", "--quick", "--matmul-size", "32", "--repeats", "0"]
        )
        == 2
    )
    assert "--repeats must be an integer >= 1; found 0" in capsys.readouterr().err
    assert main(["bench", "--quick", "--against", "timm,tensorrt", "--matmul-size", "32"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --against: unknown peer(s) tensorrt; expected a comma list of timm, compile, onnxruntime"
    )
    assert main(["tune", "--model", "resnet_mini"]) == 2
    assert "CNN baseline" in capsys.readouterr().err


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
