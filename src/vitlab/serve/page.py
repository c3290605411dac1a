"""The page of `vitlab serve`, built with Gradio: four tabs over the functions of vitlab.serve.look and
vitlab.serve.runs.

    Predict and look   drop images or pick a bundled photo; the top-5 as bars; the class token's attention
                       of a layer and head next to the attention rollout, with the opacity and upsampling
                       of `vitlab attention`, and the commands that give the same numbers
    Inside             the paper's Figure 7 of the loaded model and its token norms per layer
                       (`vitlab inspect`)
    Runs               the training runs under the runs folder, two side by side: summary, curves,
                       confusion matrix, per-class accuracy
    Report             a `vitlab reproduce` report found there, with its figures

Offline by construction: no analytics and no update check (`analytics_enabled=False`), no share link,
no server-side rendering through Node, and a theme with the system's fonts only, so the browser fetches
nothing but the page's own files from the server.

Gradio is an optional dependency (`pip install 'vitlab[serve]'`), imported only when a page is built.
"""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.SelectData)
# as objects to know what to pass them.
import importlib.util
import shlex
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from PIL import Image

from vitlab.data.photos import sample_photos
from vitlab.errors import VitlabError
from vitlab.options import PAGE_KINDS
from vitlab.serve import look, runs
from vitlab.serve.models import ModelStore, run_sources
from vitlab.weights.checkpoint import find_runs

NO_GRADIO = (
    "vitlab serve needs Gradio, which is not installed: pip install -e '.[serve]' in a clone "
    "(make demo and make test install it)"
)

CSS = """
.vl-topk { display: flex; flex-direction: column; gap: 6px; padding: 4px 2px; }
.vl-row { display: grid; grid-template-columns: minmax(9em, 2fr) 3fr 5.2em; gap: 10px; align-items: center; }
.vl-label { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.vl-class { color: var(--body-text-color-subdued); font-size: 0.85em; }
.vl-bar { background: var(--neutral-100); border-radius: 4px; height: 1.1em; overflow: hidden; }
.vl-fill { background: var(--color-accent); height: 100%; }
.vl-prob { text-align: right; font-variant-numeric: tabular-nums; }
.vl-error { color: #991b1b; background: #fef2f2; border: 1px solid #fecaca; border-radius: 6px; padding: 8px 12px; }
"""
HEAD_CHOICES = ["mean", "max", "min"]


def check_gradio() -> None:
    """A VitlabError saying in one line how to get Gradio, if it is not installed; cheap (nothing is
    imported), so a command can refuse before it loads a model."""
    try:
        found = importlib.util.find_spec("gradio") is not None
    except ValueError:  # a module entry without a spec: not importable either
        found = False
    if not found:
        raise VitlabError(NO_GRADIO)


def require_gradio():
    """The gradio module (imported on first use: it takes seconds), or a VitlabError saying how to get it."""
    check_gradio()
    try:
        import gradio  # optional: only `vitlab serve` needs it
    except ImportError as e:
        raise VitlabError(NO_GRADIO) from e
    return gradio


def theme():
    """Gradio's default look with the system's fonts: nothing is fetched from a font service."""
    gr = require_gradio()
    return gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "Consolas", "monospace"]
    )


def save_samples(folder: Path) -> list[Path]:
    """The bundled sample photos as PNG files (lossless), so they go through the same file path as an
    upload and `vitlab predict` gives the same numbers for the saved file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, image in sample_photos():
        path = folder / f"{name}.png"
        if not path.exists():
            image.save(path, format="PNG", compress_level=1)  # lossless either way; level 1 saves seconds
        paths.append(path)
    return paths


def build_page(
    store: ModelStore,
    *,
    runs_dir: str | Path = "runs",
    work_dir: str | Path | None = None,
    model: str | None = None,
    samples: list[Path] | None = None,
):
    """The page as a gradio.Blocks (not launched). `model`: the key of the model shown first; the
    runs under `runs_dir` are listed as models too. `work_dir` holds what the page draws (Figure 7,
    curves); a new temporary folder by default."""
    gr = require_gradio()
    work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="vitlab-serve-"))
    samples = samples if samples is not None else save_samples(work_dir / "samples")
    handlers = Handlers(store, runs_dir=Path(runs_dir).expanduser(), work_dir=work_dir, samples=samples)
    handlers.scan_runs()
    # Uploads and drawn pictures older than a day are deleted every hour: the disk stays bounded too.
    with gr.Blocks(title="vitlab", analytics_enabled=False, delete_cache=(3600, 24 * 3600)) as page:
        shared = SimpleNamespace(
            current=gr.State(model),  # the key of the model shown, or None
            shown_tab=gr.State("predict"),  # the id of the tab shown: Inside draws only when it is
            paths=gr.State([]),  # the images dropped, in order
            results=gr.State([]),  # their top-5, as look.predict gives them
        )
        gr.Markdown("## vitlab: what the Vision Transformer predicts, and where it looks")
        header = model_header(store.keys(), model)
        with gr.Tabs():
            look_ui = predict_tab(samples)
            inside_ui = inside_tab()
            runs_ui = runs_tab()
            report_ui = report_tab()
        # Work on a model runs one request at a time (concurrency_id "model"): a forward pass already
        # uses every core, and one at a time keeps the memory of the server bounded.
        wire_model_choice(page, handlers, shared, header, look_ui, inside_ui, runs_ui, report_ui)
        wire_predict(handlers, shared, look_ui)
        wire_tabs(handlers, shared, header, look_ui, inside_ui, runs_ui, report_ui)
    return page


# ----------------------------------------------------------------------------------------------------
# Handlers. Each catches VitlabError (a user's mistake: bad file, bad weights) and shows it in the page;
# anything else is a bug, which Gradio reports and survives. Their names are the page's API names.


class Handlers:
    """What the page's events call, over one ModelStore (shared by every browser tab), the runs folder,
    the folder the page draws in, and the sample photos."""

    def __init__(self, store: ModelStore, *, runs_dir: Path, work_dir: Path, samples: list[Path]):
        self.gr = require_gradio()
        self.store, self.runs_dir, self.work_dir, self.samples = store, runs_dir, work_dir, samples
        self.inside_done: dict[str, tuple[dict, dict]] = {}  # model key -> (Figure 7's summary, the token norms')
        self.figure7_lock = threading.Lock()

    def scan_runs(self) -> list[runs.Run]:
        """The runs under runs_dir now; each one joins the model list."""
        found = runs.list_runs(self.runs_dir)
        for source in run_sources([r.folder for r in found]):
            self.store.add(source)
        return found

    # -- the model -----------------------------------------------------------------------------------

    def model_panel(self, key):
        """(status HTML, layer slider, head dropdown, rollout start slider) for the model `key`."""
        gr, loaded = self.gr, self.store.get(key)
        if loaded.is_vit:
            depth, heads = len(loaded.model.blocks), loaded.model.cfg.heads
            layer = gr.update(minimum=0, maximum=depth - 1, value=depth - 1, interactive=True)
            head = gr.update(choices=HEAD_CHOICES + [str(h) for h in range(heads)], value="mean", interactive=True)
            start = gr.update(minimum=0, maximum=depth - 1, value=0, interactive=True)
        else:
            layer = head = start = gr.update(interactive=False)
        return loaded.describe(), layer, head, start

    def choose_model(self, key, current):
        """The model dropdown changed: show the new model, or keep the current one if it fails to load."""
        gr = self.gr
        try:
            info, layer, head, start = self.model_panel(key)
        except VitlabError as e:
            return gr.update(value=current), current, *([gr.update()] * 4), look.error_html(e.for_cli())
        return gr.update(), key, info, layer, head, start, ""

    def load_model(self, kind, value, current):
        """The load box: load `--<kind> <value>` and select it, or say why not (the current model stays)."""
        gr = self.gr
        try:
            loaded = self.store.request(kind, value)
        except VitlabError as e:
            return gr.update(), current, gr.update(), look.error_html(e.for_cli()), *([gr.update()] * 3)
        key = loaded.source.label
        info, layer, head, start = self.model_panel(key)
        return gr.update(choices=self.store.keys(), value=key), key, info, "", layer, head, start

    def on_page_load(self, current):
        gr, choices = self.gr, self.store.keys()
        if current is None:
            no_model = "No model loaded yet: choose one above, or load one."
            return gr.update(choices=choices), current, no_model, *([gr.update()] * 3)
        try:
            info, layer, head, start = self.model_panel(current)
        except VitlabError as e:
            info, layer, head, start = look.error_html(e.for_cli()), gr.update(), gr.update(), gr.update()
        return gr.update(choices=choices, value=current), current, info, layer, head, start

    # -- Predict and look ----------------------------------------------------------------------------

    def predict(self, key, files, old_paths=(), old_results=()):
        """The top-5 of each image: those predicted before are kept, the new ones predicted, and the
        first new one shown (a drop adds to the images already there)."""
        gr = self.gr
        paths = [str(f) for f in (files or [])]
        hidden = gr.update(choices=[], value=None, visible=False)
        if not paths:
            return [], [], hidden, "", gr.update(value=[], visible=False)
        if key is None:
            message = look.error_html("no model loaded: choose one in the Model list, or load one")
            return paths, [], hidden, message, gr.update(visible=False)
        known = dict(zip(old_paths or (), old_results or ()))
        todo = [p for p in paths if p not in known]
        try:
            fresh = dict(zip(todo, look.predict(self.store.get(key), todo))) if todo else {}
        except VitlabError as e:  # the model cannot predict (e.g. a zero head): say so for each image
            fresh = {p: {"file": Path(p).name, "error": e.for_cli()} for p in todo}
        results = [known[p] if p in known else fresh[p] for p in paths]
        shown = next((i for i, p in enumerate(paths) if p in fresh), 0)
        names = [f"{i + 1}. {r['file']}" for i, r in enumerate(results)]
        which = gr.update(choices=names, value=names[shown], visible=len(names) > 1)
        table = gr.update(value=look.summary_rows(results), visible=len(names) > 1)
        return paths, results, which, look.topk_html(results[shown]), table

    def repredict(self, key, paths):
        """Every image again, for another model."""
        return self.predict(key, paths)

    def show(self, which, results):
        index = _index(which)
        return look.topk_html(results[index]) if results and index < len(results) else ""

    def overlays(self, key, paths, which, layer, head, alpha, upsample, start, fusion, discard):
        """The class-token map and the rollout of the image shown, and the commands that draw them."""
        index = _index(which)
        if key is None or not paths or index >= len(paths):
            return None, "", None, "", ""
        path = paths[index]
        out = []
        for method, kwargs in (
            ("cls", dict(head=head)),
            ("rollout", dict(head=fusion, start_layer=int(start), discard_ratio=float(discard))),
        ):
            try:
                loaded = self.store.get(key)
                o = look.attention_overlay(
                    loaded, path, method=method, layer=int(layer), alpha=float(alpha), upsample=upsample, **kwargs
                )
                out += [o.picture, o.caption]
            except VitlabError as e:
                out += [None, f"error: {e.for_cli()}"]
        name = shlex.quote(Path(path).name)
        common = f"--layer {int(layer)} --alpha {float(alpha):g} --upsample {upsample} --out attention"
        commands = (
            "The same numbers from the command line:\n\n```bash\n"
            f"vitlab predict {name} {key}\n"
            f"vitlab attention {name} {key} --method cls --head {head} {common}\n"
            f"vitlab attention {name} {key} --method rollout --head {fusion} --start-layer {int(start)} "
            f"--discard-ratio {float(discard):g} {common}\n```"
        )
        return (*out, commands)

    # -- Inside (Figure 7) ---------------------------------------------------------------------------

    def drawn_inside(self, key):
        """(Figure 7's summary, the token norms') of the model, drawn once per model into one folder, from
        the first 16 bundled photos, as `vitlab inspect` draws them without --images."""
        with self.figure7_lock:
            if key not in self.inside_done:
                out = self.work_dir / "figure7" / f"model_{len(self.inside_done)}"
                loaded, photos = self.store.get(key), self.samples[:16]
                self.inside_done[key] = (look.figure7(loaded, photos, out), look.token_norms(loaded, photos, out))
            return self.inside_done[key]

    def inside(self, key):
        """The Inside tab: Figure 7's text and panels (a), (b), (c), then the token norms' text and map."""
        if key is None:
            return "No model loaded.", None, None, None, "", None
        try:
            summary, norms = self.drawn_inside(key)
        except VitlabError as e:
            return look.error_html(e.for_cli()), None, None, None, "", None
        files = {Path(f).name: str(f) for f in summary["files"] + norms["files"]}
        text = (
            f"Figure 7 of `{key}` (the paper's Section 4.5), as `vitlab inspect {key} --out DIR` draws it; "
            f"(c) averages over {summary['n_images']} bundled photos.\n\n"
            + "\n".join(f"- {line}" for line in summary["lines"])
        )
        return (
            text,
            files.get("fig7a_patch_embedding_pcs.png"),
            files.get("fig7b_position_embedding_similarity.png"),
            files.get("fig7c_mean_attention_distance.png"),
            look.token_norm_markdown(norms),
            files.get("token_norms.png"),
        )

    def inside_if_shown(self, key, tab):
        return self.inside(key) if tab == "inside" else ("", None, None, None, "", None)

    # -- Runs ----------------------------------------------------------------------------------------

    def runs_overview(self):
        gr, runs_dir = self.gr, self.runs_dir
        found = self.scan_runs()
        names = [r.name for r in found]
        if found:
            text = f"{len(found)} run(s) under `{runs_dir}`. Each one is also in the Model list above."
        else:
            text = (
                f"No training runs under `{runs_dir}` yet. `make demo` makes two (runs/demo/pos_learned and "
                "pos_none); `vitlab train` and `vitlab finetune` make one each with `--out runs/NAME`."
            )
        a = names[0] if names else None
        b = names[1] if len(names) > 1 else None
        return text, gr.update(choices=names, value=a), gr.update(choices=names, value=b)

    def show_run(self, name):
        """One side of the Runs tab: summary, curves, confusion matrix, per-class accuracy."""
        gr, runs_dir = self.gr, self.runs_dir
        hidden = gr.update(value=None, visible=False)
        if not name:
            return "", hidden, hidden, hidden
        folder = next((f for f in find_runs(runs_dir) if runs.run_name(f, runs_dir) == name), None)
        if folder is None:
            return look.error_html(f"run {name} is no longer under {runs_dir}"), hidden, hidden, hidden
        run = runs.read_run(folder, runs_dir)
        pictures = []
        for path in (runs.curves_image(run, self.work_dir / "curves"), run.image("confusion.png")):
            # Handed over as pixels: the page serves no file from the runs folder (it holds weights too).
            pictures.append(gr.update(value=_decoded(path), visible=True) if path else hidden)
        table = (
            gr.update(value={"headers": run.per_class[0], "data": runs.per_class_rows(run)}, visible=True)
            if len(run.per_class) > 1
            else hidden
        )
        return runs.run_markdown(run), *pictures, table

    # -- Reproduce report ----------------------------------------------------------------------------

    def report_overview(self):
        gr, runs_dir = self.gr, self.runs_dir
        reports = runs.find_reports(runs_dir)
        names = [str(r.relative_to(runs_dir)) if r != runs_dir else "." for r in reports]
        if not names:
            return gr.update(choices=[], value=None), (
                f"No `vitlab reproduce` report under `{runs_dir}`. `vitlab reproduce --out {runs_dir}/reproduce` "
                "makes one (`--quick` in minutes)."
            )
        return gr.update(choices=names, value=names[0]), gr.update()

    def show_report(self, name):
        if not name:
            return ""
        folder = self.runs_dir / name
        if not (folder / "report.md").is_file():
            return look.error_html(f"{folder / 'report.md'} is no longer there")
        return runs.report_markdown(folder)


# ----------------------------------------------------------------------------------------------------
# Layout: the model row, then one builder per tab, each returning the components the events need


def picture(**kwargs):
    """An image the page draws: PNG (lossless, so it is the command line's picture), not editable."""
    gr = require_gradio()
    return gr.Image(format="png", interactive=False, buttons=["download", "fullscreen"], **kwargs)


def model_header(keys: list[str], model: str | None) -> SimpleNamespace:
    """The model list and its status, and the box that loads another model: model_list, model_info,
    model_error, kind, value, load."""
    gr = require_gradio()
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            model_list = gr.Dropdown(
                choices=keys,
                value=model,
                label="Model",
                elem_id="model",
                info="the model given to `vitlab serve`, the runs found, and those loaded here",
            )
            model_info = gr.Markdown(elem_id="model-info")
            model_error = gr.HTML(elem_id="model-error")
        with gr.Column(scale=2):
            with gr.Accordion("Load another model", open=model is None):
                kind = gr.Radio(
                    list(PAGE_KINDS),
                    value="checkpoint",
                    label="as",
                    elem_id="load-kind",
                    info="checkpoint: a vitlab run; pretrained: timm, Hugging Face, torchvision or JAX "
                    "weights (file, folder or hub id); model: a registered name, random weights",
                )
                value = gr.Textbox(
                    label="path, hub id or name", elem_id="load-value", placeholder="runs/demo/pos_learned"
                )
                load = gr.Button("Load", elem_id="load")
    return SimpleNamespace(
        model_list=model_list, model_info=model_info, model_error=model_error, kind=kind, value=value, load=load
    )


def predict_tab(samples: list[Path]) -> SimpleNamespace:
    """Predict and look: the images and the top-5, then the two overlays and their controls (see
    `attention_panel`); tab, files, sample_gallery, which, topk, table and the attention panel's names."""
    gr = require_gradio()
    with gr.Tab("Predict and look", id="predict") as tab:
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                files = gr.File(
                    file_count="multiple", label="Images: drop one or more here, or click", elem_id="images", height=140
                )
                sample_gallery = gr.Gallery(
                    value=[(str(p), p.stem) for p in samples],
                    label="or a sample photo",
                    columns=4,
                    object_fit="cover",
                    allow_preview=False,
                    interactive=False,
                    buttons=[],
                    elem_id="samples",
                )
            with gr.Column(scale=3):
                which = gr.Dropdown(label="image shown", choices=[], visible=False, elem_id="which")
                topk = gr.HTML(elem_id="topk", label="top-5")
                table = gr.Dataframe(
                    headers=["image", "probability", "top-1 class"], visible=False, interactive=False, elem_id="table"
                )
        panel = attention_panel()
    return SimpleNamespace(
        tab=tab, files=files, sample_gallery=sample_gallery, which=which, topk=topk, table=table, **vars(panel)
    )


def attention_panel() -> SimpleNamespace:
    """The class-token map and the rollout side by side, the settings of `vitlab attention`, and the commands
    that give the same numbers: cls_picture, cls_caption, rollout_picture, rollout_caption, layer, head,
    alpha, upsample, start, fusion, discard, commands."""
    gr = require_gradio()
    with gr.Row():
        with gr.Column():
            cls_picture = picture(label="class-token attention", elem_id="overlay-cls", height=360)
            cls_caption = gr.Markdown(elem_id="caption-cls")
        with gr.Column():
            rollout_picture = picture(label="attention rollout", elem_id="overlay-rollout", height=360)
            rollout_caption = gr.Markdown(elem_id="caption-rollout")
    with gr.Row():
        layer = gr.Slider(0, 1, value=1, step=1, label="layer (0 = first)", elem_id="layer")
        head = gr.Dropdown(HEAD_CHOICES, value="mean", label="head (or fused heads)", elem_id="head")
        alpha = gr.Slider(0, 1, value=0.5, step=0.05, label="heatmap opacity", elem_id="alpha")
        upsample = gr.Radio(
            list(look.UPSAMPLING),
            value="bilinear",
            label="upsampling",
            info="nearest shows the patches",
            elem_id="upsample",
        )
    with gr.Accordion("Rollout settings", open=False):
        with gr.Row():
            start = gr.Slider(0, 1, value=0, step=1, label="first layer rolled out", elem_id="start")
            fusion = gr.Radio(HEAD_CHOICES, value="mean", label="head fusion", elem_id="fusion")
            discard = gr.Slider(
                0, 0.9, value=0.0, step=0.05, elem_id="discard", label="discard ratio (lowest share of each row zeroed)"
            )
    commands = gr.Markdown(elem_id="commands")
    return SimpleNamespace(
        cls_picture=cls_picture,
        cls_caption=cls_caption,
        rollout_picture=rollout_picture,
        rollout_caption=rollout_caption,
        layer=layer,
        head=head,
        alpha=alpha,
        upsample=upsample,
        start=start,
        fusion=fusion,
        discard=discard,
        commands=commands,
    )


def inside_tab() -> SimpleNamespace:
    """Inside (Figure 7): the figure's text and panels (a), (b), (c), then the token norms: tab, text,
    fig_a, fig_b, fig_c, norms_text, norms_picture."""
    gr = require_gradio()
    with gr.Tab("Inside (Figure 7)", id="inside") as tab:
        text = gr.Markdown(elem_id="inside-text")
        with gr.Row():
            # Each figure carries its own title, as `vitlab inspect` writes it.
            fig_a = picture(show_label=False, elem_id="fig7a")
            fig_b = picture(show_label=False, elem_id="fig7b")
            fig_c = picture(show_label=False, elem_id="fig7c")
        norms_text = gr.Markdown(elem_id="token-norms-text")
        norms_picture = picture(show_label=False, elem_id="token-norms")
    return SimpleNamespace(
        tab=tab,
        outputs=[text, fig_a, fig_b, fig_c, norms_text, norms_picture],  # as Handlers.inside returns them
    )


def runs_tab() -> SimpleNamespace:
    """Runs: two runs side by side; tab, text, rescan, and sides: per side (choice, summary, curves,
    confusion, per_class)."""
    gr = require_gradio()
    with gr.Tab("Runs", id="runs") as tab:
        with gr.Row():
            text = gr.Markdown(elem_id="runs-text")
            rescan = gr.Button("Look for new runs", scale=0, elem_id="rescan")
        sides = []
        with gr.Row(equal_height=False):
            for side in ("a", "b"):
                with gr.Column():
                    choice = gr.Dropdown(label=f"run {side.upper()}", choices=[], elem_id=f"run-{side}")
                    summary = gr.Markdown(elem_id=f"run-{side}-summary")
                    # The run's own figures carry their titles.
                    curves = picture(show_label=False, visible=False, elem_id=f"run-{side}-curves")
                    confusion = picture(show_label=False, visible=False, height=480, elem_id=f"run-{side}-confusion")
                    per_class = gr.Dataframe(
                        label="per-class accuracy", visible=False, interactive=False, elem_id=f"run-{side}-per-class"
                    )
                    sides.append((choice, summary, curves, confusion, per_class))
    return SimpleNamespace(tab=tab, text=text, rescan=rescan, sides=sides)


def report_tab() -> SimpleNamespace:
    """Reproduce report: a `vitlab reproduce` report found under the runs folder; tab, choice, text."""
    gr = require_gradio()
    with gr.Tab("Reproduce report", id="report") as tab:
        choice = gr.Dropdown(label="report", choices=[], elem_id="report-choice")
        text = gr.Markdown(elem_id="report-text")
    return SimpleNamespace(tab=tab, choice=choice, text=text)


# ----------------------------------------------------------------------------------------------------
# Events

ON_MODEL = dict(concurrency_id="model", concurrency_limit=1)  # one request at a time works on a model


def attention_io(shared, ui) -> tuple[list, list]:
    """The inputs and outputs of Handlers.overlays."""
    inputs = [shared.current, shared.paths, ui.which, ui.layer, ui.head, ui.alpha, ui.upsample, ui.start]
    outputs = [ui.cls_picture, ui.cls_caption, ui.rollout_picture, ui.rollout_caption, ui.commands]
    return inputs + [ui.fusion, ui.discard], outputs


def predict_outputs(shared, ui) -> list:
    """The outputs of Handlers.predict."""
    return [shared.paths, shared.results, ui.which, ui.topk, ui.table]


def wire_model_choice(page, h: Handlers, shared, header, ui, inside_ui, runs_ui, report_ui) -> None:
    """The page's first load (the model's panel, the runs, the reports), the model list and the load box:
    the model's panel, then every tab that shows the model redrawn for it (the images predicted again,
    the overlays, Inside if it is shown)."""
    current = shared.current
    panel = [ui.layer, ui.head, ui.start]
    attention_inputs, attention_outputs = attention_io(shared, ui)

    def redraw(event) -> None:
        (
            event.then(h.repredict, [current, shared.paths], predict_outputs(shared, ui), **ON_MODEL)
            .then(h.overlays, attention_inputs, attention_outputs, **ON_MODEL)
            .then(h.inside_if_shown, [current, shared.shown_tab], inside_ui.outputs, concurrency_id="figure7")
        )

    page.load(h.on_page_load, [current], [header.model_list, current, header.model_info, *panel], **ON_MODEL).then(
        h.runs_overview, None, [runs_ui.text, runs_ui.sides[0][0], runs_ui.sides[1][0]]
    ).then(h.report_overview, None, [report_ui.choice, report_ui.text])
    chosen = header.model_list.input(
        h.choose_model,
        [header.model_list, current],
        [header.model_list, current, header.model_info, *panel, header.model_error],
        **ON_MODEL,
    )
    redraw(chosen)
    loaded = header.load.click(
        h.load_model,
        [header.kind, header.value, current],
        [header.model_list, current, header.model_info, header.model_error, *panel],
        api_name="load_model",
        **ON_MODEL,
    )
    redraw(loaded)


def wire_predict(h: Handlers, shared, ui) -> None:
    """Predict and look: a drop, a deletion or a sample photo predicts and draws the overlays; a control
    redraws them (the last move only, while one is drawn)."""
    gr = require_gradio()
    current, paths, results = shared.current, shared.paths, shared.results
    attention_inputs, attention_outputs = attention_io(shared, ui)
    outputs = predict_outputs(shared, ui)

    def pick_sample(key, evt: gr.SelectData):
        return (None, *h.predict(key, [h.samples[evt.index]]))

    ui.files.upload(h.predict, [current, ui.files, paths, results], outputs, api_name="predict", **ON_MODEL).then(
        h.overlays, attention_inputs, attention_outputs, **ON_MODEL
    )
    ui.files.delete(h.predict, [current, ui.files, paths, results], outputs, **ON_MODEL).then(
        h.overlays, attention_inputs, attention_outputs, **ON_MODEL
    )
    ui.files.clear(
        lambda: ([], [], gr.update(choices=[], value=None, visible=False), "", gr.update(visible=False)), None, outputs
    ).then(lambda: (None, "", None, "", ""), None, attention_outputs)
    ui.sample_gallery.select(pick_sample, [current], [ui.files, *outputs], **ON_MODEL).then(
        h.overlays, attention_inputs, attention_outputs, **ON_MODEL
    )
    ui.which.input(h.show, [ui.which, results], ui.topk).then(
        h.overlays, attention_inputs, attention_outputs, **ON_MODEL
    )
    for control in (ui.layer, ui.alpha, ui.start, ui.discard):
        control.release(h.overlays, attention_inputs, attention_outputs, trigger_mode="always_last", **ON_MODEL)
    for control in (ui.head, ui.upsample, ui.fusion):
        control.input(h.overlays, attention_inputs, attention_outputs, trigger_mode="always_last", **ON_MODEL)


def wire_tabs(h: Handlers, shared, header, ui, inside_ui, runs_ui, report_ui) -> None:
    """Choosing a tab: which one is shown (Inside draws only then), Inside's figures, the runs and the
    reports found now; the Runs tab's rescan (new runs join the model list) and its two sides."""
    gr = require_gradio()
    inside_ui.tab.select(h.inside, [shared.current], inside_ui.outputs, concurrency_id="figure7", concurrency_limit=1)
    for tab, name in ((ui.tab, "predict"), (inside_ui.tab, "inside"), (runs_ui.tab, "runs"), (report_ui.tab, "report")):
        tab.select(lambda name=name: name, None, shared.shown_tab)
    overview = [runs_ui.text, runs_ui.sides[0][0], runs_ui.sides[1][0]]
    runs_ui.tab.select(h.runs_overview, None, overview)
    runs_ui.rescan.click(h.runs_overview, None, overview).then(
        lambda: gr.update(choices=h.store.keys()), None, header.model_list
    )
    for choice, *outputs in runs_ui.sides:
        choice.change(h.show_run, [choice], outputs)
    report_ui.tab.select(h.report_overview, None, [report_ui.choice, report_ui.text])
    report_ui.choice.change(h.show_report, [report_ui.choice], report_ui.text)


def _decoded(path: Path) -> Image.Image | None:
    """A PNG of a run, decoded (None if it is unreadable)."""
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except OSError:
        return None


def _index(which: str | None) -> int:
    """The index of the image shown, from the selector's "N. name" label."""
    try:
        return int(str(which).split(".", 1)[0]) - 1
    except ValueError:
        return 0


__all__ = ["NO_GRADIO", "CSS", "check_gradio", "require_gradio", "theme", "save_samples", "build_page"]
