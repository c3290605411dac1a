"""Preprocessing parity, robust image opening, `vitlab predict` and `vitlab export`.

All weights are random-init reference models saved by the tests (no network). The preprocessing
checks use a natural photo (skimage.data.chelsea, 300x451, so the resize-then-crop path is exercised).
"""

from __future__ import annotations

import io
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from vitlab import PretrainedCfg, create_model
from vitlab.cli import main
from vitlab.data.preprocess import eval_transform, open_image
from vitlab.errors import VitlabError
from vitlab.weights import PREPROCESSING

timm = pytest.importorskip("timm")
skimage_data = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def chelsea() -> Image.Image:
    return Image.fromarray(skimage_data.chelsea())  # (300, 451, 3) uint8, a cat


@pytest.fixture(scope="module")
def timm_dir(tmp_path_factory):
    """A random-init vit_tiny_patch16_224 in timm's hub layout (config.json + model.safetensors)."""
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224").eval()
    folder = tmp_path_factory.mktemp("timm") / "vit_tiny"
    save_for_hf(ref, folder, safe_serialization=True)
    return folder, ref


def max_diff(a, b) -> float:
    return (torch.as_tensor(a) - torch.as_tensor(b)).abs().max().item()


# ----------------------------------------------------------------------------------------------------
# Preprocessing parity with each source's own pipeline


def test_eval_transform_equals_timm_for_timm_weights(timm_dir, chelsea):
    from timm.data import create_transform, resolve_data_config

    folder, ref = timm_dir
    model = create_model("vit_tiny_patch16_224", pretrained=str(folder))
    ours = eval_transform(model.pretrained_cfg)(chelsea)
    theirs = create_transform(**resolve_data_config(model=ref))(chelsea)
    assert ours.shape == theirs.shape == (3, 224, 224)
    assert max_diff(ours, theirs) <= 1e-3


def test_eval_transform_equals_hf_vit_image_processor(tmp_path, chelsea):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    processor = transformers.ViTImageProcessor()  # google/vit-*: 224x224 bilinear, no crop, 0.5/0.5
    processor.save_pretrained(tmp_path / "hf")
    model = create_model(pretrained=str(tmp_path / "hf"))
    ours = eval_transform(model.pretrained_cfg)(chelsea)
    theirs = processor(images=chelsea, return_tensors="pt").pixel_values[0]
    assert ours.shape == theirs.shape == (3, 224, 224)
    assert max_diff(ours, theirs) <= 1e-3


def test_eval_transform_equals_torchvision_weights_transforms(chelsea):
    from torchvision.models import ViT_B_16_Weights

    cfg = PretrainedCfg(**PREPROCESSING["torchvision"], input_size=(3, 224, 224))
    ours = eval_transform(cfg)(chelsea)
    theirs = ViT_B_16_Weights.IMAGENET1K_V1.transforms()(chelsea)  # resize 256 bilinear, crop 224, ImageNet stats
    assert max_diff(ours, theirs) <= 1e-3


def test_sources_really_preprocess_differently(chelsea):
    """The reason pretrained_cfg is per source: JAX squash-resize and timm crop give different inputs."""
    jax = eval_transform(PretrainedCfg(**PREPROCESSING["jax"], input_size=(3, 224, 224)))(chelsea)
    tm = eval_transform(PretrainedCfg(**PREPROCESSING["timm"], input_size=(3, 224, 224)))(chelsea)
    assert max_diff(jax, tm) > 0.1


# ----------------------------------------------------------------------------------------------------
# Opening images


def photo(size=(48, 32)) -> Image.Image:
    return Image.fromarray(skimage_data.astronaut()).resize(size)


def test_modes_are_converted_to_rgb_by_meaning(tmp_path):
    rgb = photo()
    gray = rgb.convert("L")
    gray.save(tmp_path / "gray.png")
    out = np.asarray(open_image(tmp_path / "gray.png"))
    assert out.shape == (32, 48, 3) and (out == np.asarray(gray)[..., None]).all()

    # 16-bit grayscale: values are scaled (x / 257), not clipped at 255
    deep = np.asarray(gray).astype(np.uint16) * 257
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    out = np.asarray(open_image(tmp_path / "deep.png"))[..., 0].astype(int)
    assert np.abs(out - np.asarray(gray)).max() <= 1

    pal = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.save(tmp_path / "pal.png")
    assert (np.asarray(open_image(tmp_path / "pal.png")) == np.asarray(pal.convert("RGB"))).all()

    rgba = rgb.convert("RGBA")
    alpha = np.full((32, 48), 255, np.uint8)
    alpha[:, :10] = 0  # a transparent strip
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(tmp_path / "rgba.png")
    out = np.asarray(open_image(tmp_path / "rgba.png"))
    assert (out[:, :10] == 255).all() and (out[:, 10:] == np.asarray(rgb)[:, 10:]).all()

    rgb.convert("CMYK").save(tmp_path / "cmyk.jpg", quality=95)
    assert Image.open(tmp_path / "cmyk.jpg").mode == "CMYK"
    out = np.asarray(open_image(tmp_path / "cmyk.jpg")).astype(float)
    assert np.abs(out - np.asarray(rgb)).mean() < 10

    for suffix in ("webp", "bmp", "tiff"):
        rgb.save(tmp_path / f"x.{suffix}")
        assert open_image(tmp_path / f"x.{suffix}").size == (48, 32)


def test_exif_orientation_is_applied(tmp_path):
    img = photo((48, 32))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    img.save(tmp_path / "rotated.jpg", exif=exif)
    assert Image.open(tmp_path / "rotated.jpg").size == (48, 32)
    assert open_image(tmp_path / "rotated.jpg").size == (32, 48)


def bomb_png(path: Path, width: int = 40000, height: int = 40000) -> None:
    """A tiny PNG whose header claims width x height pixels (1.6 G): PIL refuses it at open."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = 8 + 8  # signature, then length + b"IHDR"
    data[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", crc)
    path.write_bytes(bytes(data))


@pytest.fixture
def bad_files(tmp_path) -> dict[str, Path]:
    photo().save(tmp_path / "good.jpg")
    full = (tmp_path / "good.jpg").read_bytes()
    files = {
        "empty": tmp_path / "empty.jpg",
        "text": tmp_path / "notes.png",
        "truncated": tmp_path / "truncated.jpg",
        "corrupt": tmp_path / "corrupt.png",
        "bomb": tmp_path / "bomb.png",
    }
    files["empty"].write_bytes(b"")
    files["text"].write_text("this is not an image\n")
    files["truncated"].write_bytes(full[: len(full) // 2])
    png = io.BytesIO()
    photo().save(png, "PNG")
    raw = bytearray(png.getvalue())
    raw[60:200] = bytes(140)  # zero a stretch of the compressed pixel data
    files["corrupt"].write_bytes(bytes(raw))
    bomb_png(files["bomb"])
    return files


def test_bad_files_raise_errors_naming_the_file(bad_files):
    expected = {
        "empty": "empty",
        "text": "not an image",
        "truncated": "truncated",
        "corrupt": "corrupt",
        "bomb": "decompression bomb",
    }
    for kind, path in bad_files.items():
        with pytest.raises(VitlabError) as err:
            open_image(path)
        assert str(path) in str(err.value) and expected[kind] in str(err.value), (kind, str(err.value))


# ----------------------------------------------------------------------------------------------------
# vitlab predict


def test_predict_matches_timm_end_to_end_and_reports_bad_files(timm_dir, bad_files, tmp_path, capsys, chelsea):
    from timm.data import create_transform, resolve_data_config

    folder, ref = timm_dir
    chelsea.save(tmp_path / "cat.jpg", quality=95)
    Image.fromarray(skimage_data.camera()).save(tmp_path / "camera.png")  # grayscale
    good = [tmp_path / "cat.jpg", tmp_path / "camera.png"]
    args = [str(p) for p in good] + [str(p) for p in bad_files.values()]
    rc = main(
        [
            "predict",
            *args,
            "--model",
            "vit_tiny_patch16_224",
            "--pretrained",
            str(folder),
            "--json",
            "--topk",
            "3",
            "--device",
            "cpu",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2  # some files failed
    doc = json.loads(out)
    results = {Path(r["file"]).name: r for r in doc["results"]}
    assert [Path(r["file"]).name for r in doc["results"]] == [Path(a).name for a in args]  # order kept
    for path in bad_files.values():
        assert "error" in results[path.name]
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == len(bad_files) and all(
        any(str(p) in line for line in error_lines) for p in bad_files.values()
    )
    # the good images: the same top-3 as timm with timm's own preprocessing
    transform = create_transform(**resolve_data_config(model=ref))
    for path in good:
        preds = results[path.name]["predictions"]
        assert len(preds) == 3 and preds[0]["prob"] >= preds[1]["prob"] >= preds[2]["prob"]
        with torch.no_grad():
            probs = ref(transform(Image.open(path).convert("RGB"))[None]).softmax(-1)[0]
        top = probs.topk(3)
        assert [p["index"] for p in preds] == top.indices.tolist()
        assert max_diff([p["prob"] for p in preds], top.values) <= 1e-4
        names = (Path(__file__).parents[1] / "src/vitlab/resources/imagenet_classes.txt").read_text().splitlines()
        assert preds[0]["label"] == names[preds[0]["index"]]


def test_predict_text_output_bf16_and_img_size(timm_dir, tmp_path, capsys, chelsea):
    folder, _ = timm_dir
    chelsea.save(tmp_path / "cat.png")
    rc = main(
        [
            "predict",
            str(tmp_path / "cat.png"),
            "--pretrained",
            str(folder),
            "--precision",
            "bf16",
            "--img-size",
            "384",
            "--device",
            "cpu",
        ]
    )  # --model taken from config.json's architecture
    out, err = capsys.readouterr()
    assert rc == 0
    header, *lines = out.strip().splitlines()
    assert "resize short side to 426 (bicubic), centre-crop 384x384, mean (0.5, 0.5, 0.5)" in header  # 384 / 0.9
    assert lines[0] == str(tmp_path / "cat.png") and len(lines) == 6 and lines[1].lstrip().startswith("1.")
    probs = [float(line.split()[1].rstrip("%")) for line in lines[1:]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 100.01


def test_predict_refuses_a_zero_head(tmp_path):
    from safetensors.torch import save_file

    from vitlab.inference.predict import predict_files

    model = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=21843)
    torch.nn.init.zeros_(model.head.weight), torch.nn.init.zeros_(model.head.bias)
    save_file(model.state_dict(), tmp_path / "in21k.safetensors")
    photo().save(tmp_path / "a.png")
    with pytest.warns(UserWarning, match="all zeros"):
        ours = create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "in21k.safetensors"), depth=1)
    with pytest.raises(VitlabError, match="no trained classifier"):
        predict_files(ours, [tmp_path / "a.png"])


# ----------------------------------------------------------------------------------------------------
# vitlab export


def test_export_safetensors_reloads_in_vitlab_and_timm(timm_dir, tmp_path, capsys):
    folder, ref = timm_dir
    out = tmp_path / "export" / "tiny.safetensors"
    rc = main(["export", "--model", "vit_tiny_patch16_224", "--pretrained", str(folder), "--out", str(out)])
    assert rc == 0 and out.is_file() and out.with_suffix(".json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.json", "tiny.safetensors"]  # no temp files left
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(x)
        again = create_model(pretrained=str(out))  # architecture from the JSON
        assert max_diff(again(x), expected) <= 1e-5
        other = timm.create_model("vit_tiny_patch16_224").eval()
        other.load_state_dict(load_file(out), strict=True)  # timm's names: loads as is
        assert max_diff(other(x), expected) <= 1e-5
    assert again.pretrained_cfg.mean == (0.5, 0.5, 0.5) and again.pretrained_cfg.format == "vitlab"
    # and predict reads it back through --checkpoint
    photo().save(tmp_path / "a.png")
    capsys.readouterr()
    rc = main(["predict", str(tmp_path / "a.png"), "--checkpoint", str(out), "--json", "--device", "cpu"])
    assert rc == 0 and len(json.loads(capsys.readouterr().out)["results"][0]["predictions"]) == 5


def test_fine_tuning_checkpoint_folder_loads(tmp_path):
    """The training engine's checkpoint folders (model.safetensors + config.json) are a source too."""
    import vitlab
    from vitlab.weights.checkpoint import save_checkpoint

    model = vitlab.create_model("vit_mini", num_classes=3)
    torch.nn.init.normal_(model.head.weight, std=0.1)
    folder = save_checkpoint(tmp_path / "run", "epoch_001", model, {"epoch": 1})
    again = create_model(pretrained=str(folder))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(again(x), model.eval()(x)) <= 1e-6


def test_export_onnx_dynamic_batch_matches_pytorch(timm_dir, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: ONNX export cannot be checked")
    from vitlab.inference.export import export_model

    folder, _ = timm_dir
    import vitlab

    model = vitlab.create_model("vit_tiny_patch16_224", depth=2)
    torch.nn.init.normal_(model.head.weight, std=0.05)
    report = export_model(model, tmp_path / "m.onnx")
    assert report["max_abs_diff"] <= 1e-4
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 5):  # the batch axis is dynamic
        x = torch.randn(batch, 3, 224, 224)
        (got,) = session.run(["logits"], {"image": x.numpy()})
        with torch.no_grad():
            assert got.shape == (batch, 1000) and max_diff(got, model(x)) <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_export_rejects_unknown_suffix_and_writes_nothing(tmp_path):
    import vitlab
    from vitlab.inference.export import export_model

    with pytest.raises(VitlabError, match="expected a path ending in .safetensors or .onnx"):
        export_model(vitlab.create_model("vit_mini_x"), tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------
# vitlab export --format timm | hf: folders the other libraries load, checked with the real libraries

LABELS = tuple(f"kind_{i}" for i in range(7))


def fine_tuned(name: str, **kw):
    """A small model of `name` as after fine-tuning: 7 named classes, a trained (non-zero) head."""
    import vitlab

    torch.manual_seed(0)
    model = vitlab.create_model(name, depth=2, dim=32, heads=2, mlp_dim=64, num_classes=7, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.pretrained_cfg = model.pretrained_cfg.replace(label_names=LABELS, head="loaded")
    return model.eval()


TIMM_EXPORTS = {  # one of each kind of ViT timm builds: plain, DeiT distilled, CLIP (eps 1e-5), registers + GAP
    "vit_small_patch16_224": dict(img_size=64),
    "deit_tiny_distilled_patch16_224": dict(img_size=64),
    "vit_base_patch16_clip_quickgelu_224": dict(img_size=64),
    "vit_medium_patch16_reg4_gap_256": dict(img_size=64),
    "vit_small_patch14_reg4_dinov2": dict(img_size=56),
}


@pytest.mark.parametrize("name", list(TIMM_EXPORTS))
def test_export_timm_folder_loads_in_timm_with_its_fine_tuned_head(name, tmp_path):
    from timm.data import resolve_data_config

    from vitlab.inference.export import export_model

    model = fine_tuned(name, **TIMM_EXPORTS[name])
    out = tmp_path / "timm"
    report = export_model(model, out, format="timm")
    assert report["max_abs_diff"] <= 1e-4 and {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()  # no pretrained_cfg_overlay
    x = torch.randn(2, 3, *model.cfg.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(x)
        assert theirs.num_classes == 7 and ours.abs().max() > 1e-2  # the fine-tuned head, not a zero one
        assert max_diff(theirs(x), ours) <= 1e-4
    same = lambda d: {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # noqa: E731 (JSON's lists)
    assert same(resolve_data_config(model=theirs)) == same(resolve_data_config(model=model))  # same preprocessing
    assert theirs.pretrained_cfg["label_names"] == list(LABELS)
    again = create_model(pretrained=str(out))  # and vitlab reads timm's hub folder back
    with torch.no_grad():
        assert max_diff(again(x), ours) <= 1e-5
    transformers = pytest.importorskip("transformers")
    wrapped = transformers.AutoModelForImageClassification.from_pretrained(out).eval()  # TimmWrapper reads it too
    assert type(wrapped).__name__ == "TimmWrapperForImageClassification"
    assert "num_classes" not in json.loads((out / "config.json").read_text())["model_args"]  # at the top only
    assert [wrapped.config.id2label[i] for i in range(7)] == list(LABELS)
    with torch.no_grad():
        assert max_diff(wrapped(pixel_values=x).logits, ours) <= 1e-4


def test_export_hf_folder_loads_in_transformers_with_labels_and_preprocessing(tmp_path, chelsea, capsys):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    model = fine_tuned("vit_small_patch16_224", img_size=64)
    # timm's centre crop at a size whose margin is even (80 -> 64): HF rounds the crop's offset down where
    # torchvision rounds half up, so only an even margin gives the same pixels in both (docs/family.md)
    model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=0.8)
    source = tmp_path / "tuned.safetensors"
    save_file(model.state_dict(), str(source))
    (tmp_path / "tuned.json").write_text(json.dumps({"architecture": "vit_small_patch16_224"}))
    out = tmp_path / "hf"
    from vitlab.inference.export import export_model

    report = export_model(model, out, format="hf")
    assert report["max_abs_diff"] <= 1e-4
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]
    theirs = transformers.ViTForImageClassification.from_pretrained(str(out)).eval()
    assert theirs.config.num_labels == 7 and theirs.config.id2label == dict(enumerate(LABELS))
    processor = transformers.AutoImageProcessor.from_pretrained(str(out))
    pixels = processor(chelsea, return_tensors="pt")["pixel_values"]
    back = create_model(pretrained=str(out))  # vitlab reads its own save_pretrained folder back
    assert back.pretrained_cfg.label_names == LABELS and back.pretrained_cfg.crop_pct == 0.8
    ours = eval_transform(back.pretrained_cfg)(chelsea)[None]
    assert pixels.shape == ours.shape and max_diff(pixels, ours) <= 1e-5  # the same preprocessing
    assert max_diff(eval_transform(model.pretrained_cfg.replace(resize_backend="tensor"))(chelsea)[None], ours) <= 1e-6
    with torch.no_grad():
        assert max_diff(theirs(pixel_values=pixels).logits, model(pixels)) <= 1e-4
        assert max_diff(back(pixels), model(pixels)) <= 1e-5


def test_export_timm_of_a_model_built_without_create_model_and_a_linear_patch_embedding(tmp_path):
    """The literal reading of Eq. 1 (flatten + Linear) goes out as timm's Conv2d, the same weights reshaped."""
    from vitlab.inference.export import export_model
    from vitlab.models.vit import VisionTransformer, ViTConfig

    model = VisionTransformer(
        ViTConfig(img_size=32, patch_size=8, dim=32, depth=1, heads=2, num_classes=3, patch_embed="linear")
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export_model(model, tmp_path / "timm", format="timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model.eval()(x).abs().max() > 1e-2 and max_diff(theirs(x), model(x)) <= 1e-4


def test_export_folder_formats_refuse_what_the_other_library_lacks_by_name(tmp_path):
    import vitlab
    from vitlab.inference.export import export_model

    regs = fine_tuned("vit_medium_patch16_reg4_gap_256", img_size=64)
    with pytest.raises(
        VitlabError,
        match=r"^--format hf: vit_medium_patch16_reg4_gap_256 has 4 register tokens, "
        r"LayerScale, .*which transformers' ViT \(ViTForImageClassification\) has no counterpart",
    ):
        export_model(regs, tmp_path / "hf", format="hf")
    sincos = vitlab.create_model("vit_mini", pos_embed="sincos2d")
    with pytest.raises(VitlabError, match=r"^--format timm: vit_mini has pos_embed 'sincos2d'"):
        export_model(sincos, tmp_path / "timm", format="timm")
    with pytest.raises(VitlabError, match="format must be one of timm, hf; found 'keras'"):
        export_model(sincos, tmp_path / "k", format="keras")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_cli_export_format_hf_and_timm(timm_dir, tmp_path, capsys):
    folder, ref = timm_dir
    for fmt, against in (("hf", "transformers"), ("timm", "timm")):
        out = tmp_path / fmt
        rc = main(["export", "--pretrained", str(folder), "--format", fmt, "--out", str(out)])
        printed = capsys.readouterr().out
        assert rc == 0 and (out / "config.json").is_file(), printed
        assert re.search(rf"^{against} vs vitlab: max abs difference \S+ \(tolerance 1e-04\)$", printed, re.M)


def test_export_leaves_the_model_it_was_handed_as_it_was(tmp_path):
    import vitlab
    from vitlab.inference.export import export_model

    model = vitlab.create_model("vit_mini", num_classes=3, img_size=32).train().to(torch.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_model(model, tmp_path / "m.safetensors")
    export_model(model, tmp_path / "timm", format="timm", check=False)
    assert model.training and next(model.parameters()).dtype == torch.float64
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
