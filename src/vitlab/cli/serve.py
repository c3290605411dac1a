"""`vitlab serve [--checkpoint RUN | --pretrained SOURCE | --model NAME] [--runs DIR]`: a local web page.

Drop images (or pick a bundled photo) and see the top-5 and the attention overlays, with the numbers of
`vitlab predict` and `vitlab attention`; the paper's Figure 7 of the model; the training runs and the
`vitlab reproduce` report under --runs. The page is served on 127.0.0.1 (this machine only) at a free
port, printed on start, and fetches nothing from the network: no analytics, no update check, no
fonts from elsewhere. Needs the optional extra: pip install -e '.[serve]'.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from vitlab.cli._common import add_device, add_engine, add_fast_path, add_model_source, add_precision, add_threads
from vitlab.cli._help import DefaultsFormatter, example
from vitlab.errors import VitlabError, check_range
from vitlab.options import PAGE_KINDS

EXAMPLE = "vitlab serve --checkpoint runs/digits_vit"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "serve",
        help=summary,
        epilog=example(EXAMPLE),
        description="Start a local web page (Gradio) over a model: the top-5 of images you drop, the class "
        "token's attention per layer and head next to the attention rollout, the paper's Figure 7 of the "
        "model, and the training runs and `vitlab reproduce` report under --runs, two runs side by side. "
        "The model is optional: the runs found are listed as models, and others can be loaded in the page.",
        formatter_class=DefaultsFormatter,
    )
    add_model_source(p, weights="optional")
    p.add_argument(
        "--runs",
        default="runs",
        metavar="DIR",
        help="folder searched for training runs (each one is also listed as a model) and `vitlab reproduce` reports",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 opens the page to other machines")
    p.add_argument("--port", type=int, default=None, help="port to listen on (default: a free one, printed on start)")
    p.add_argument("--max-upload-mb", type=int, default=25, metavar="MB", help="largest image file the page accepts")
    p.add_argument(
        "--max-models",
        type=int,
        default=3,
        metavar="N",
        help="models kept in memory at once; the one used longest ago is dropped first",
    )
    p.add_argument(
        "--max-model-memory",
        type=float,
        default=None,
        metavar="GB",
        help="memory the models may take in all (each counted as twice its fp32 weights: the model and the "
        "copy readied for the top-k); a model that cannot fit is refused before it is read (default: a "
        "quarter of this machine's memory)",
    )
    p.add_argument(
        "--page-load",
        default=",".join(PAGE_KINDS),
        metavar="KINDS",
        help="what the page's load box accepts: a comma list of checkpoint (vitlab runs), pretrained (weight "
        "files, folders, hub ids), model (registered names); none: only the models listed at start (this "
        "command's and the runs found). With --host 0.0.0.0, every visitor can use the box",
    )
    add_device(p)
    add_precision(p)
    add_threads(p)
    add_fast_path(
        p,
        help="the top-k's path, readied in the background after a model loads (the model as built "
        "answers until then): auto and eager: the fixed rules' plan for one image at a time; tuned: vitlab "
        "tune's; "
        "compile: also torch.compile for one image (tens of seconds per model); off: the model as built. "
        "The attention maps always use the model as built",
    )
    add_engine(
        p,
        help="what computes the top-k: auto (the default): the engine fixed rules give this kind of CPU and "
        "precision for one image (ONNX Runtime for fp32 on an AMD Zen 4; else PyTorch); torch; onnxruntime: "
        "the model exported to ONNX once per weights, checked against PyTorch. The attention maps always use "
        "PyTorch's model as built",
    )
    p.set_defaults(func=run)


def check_host(host: str) -> tuple[socket.AddressFamily, str]:
    """(family, address) of --host, checked before anything loads: a name that resolves, to an address this
    machine has (a socket is bound to it, on a port the system picks, and closed)."""
    hint = "use 127.0.0.1 (this machine only), ::1, or 0.0.0.0 (every address of this machine)"
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as e:
        raise VitlabError(
            f"--host {host!r} is not a host name or address this machine can resolve "
            f"({getattr(e, 'strerror', None) or e}); {hint}"
        ) from e
    why = "no address"
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((address[0], 0))
            return family, address[0]
        except OSError as e:
            why = e.strerror or str(e)
    raise VitlabError(f"--host {host} is not an address of this machine, so nothing can listen on it ({why}); {hint}")


def free_port(host: str, family: socket.AddressFamily = socket.AF_INET) -> int:
    """A port that nothing listens on now (the system picks it)."""
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def page_kinds(text: str) -> tuple[str, ...]:
    """--page-load: a comma list of PAGE_KINDS, or none."""
    kinds = tuple(k.strip() for k in str(text).split(",") if k.strip())
    if kinds == ("none",):
        return ()
    bad = [k for k in kinds if k not in PAGE_KINDS]
    if bad or not kinds:
        raise VitlabError(f"--page-load must be a comma list of {', '.join(PAGE_KINDS)}, or none; found {text!r}")
    return kinds


@contextlib.contextmanager
def _stop_on_sigterm():
    """SIGTERM (kill, a service manager) stops the server as Ctrl-C does, so its temporary folder goes too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _say_path(loaded) -> None:
    """Print the top-k's path once the model's readied copy is ready."""
    loaded.ready.wait()
    print(f"vitlab serve: top-k path: {loaded.path}", flush=True)


def run(args) -> int:
    import torch

    from vitlab.runtime import check_threads, machine_memory
    from vitlab.serve.models import ModelSource, ModelStore
    from vitlab.serve.page import CSS, build_page, check_gradio, require_gradio, save_samples, theme

    check_range("max_upload_mb", args.max_upload_mb, low=1, integer=True)
    check_range("port", args.port, low=1, high=65535, integer=True, optional=True)
    check_threads(args.threads)
    check_range("max_models", args.max_models, low=1, integer=True)
    memory_gb = machine_memory() / 2**30  # a cap above what the process can have would be no cap at all
    check_range(
        "max_model_memory",
        args.max_model_memory,
        low=0,
        low_open=True,
        high=round(memory_gb, 1),
        optional=True,
        hint=" (GB; at most the memory this process can have)",
    )
    loadable = page_kinds(args.page_load)
    if args.img_size is not None and not (args.model or args.pretrained or args.checkpoint):
        raise VitlabError("--img-size needs a model: give --model, --pretrained or --checkpoint")
    family, address = check_host(args.host)
    check_gradio()  # before loading a model for nothing
    if args.threads:
        torch.set_num_threads(args.threads)
    limit = int(args.max_model_memory * 2**30) if args.max_model_memory else None
    store = ModelStore(
        device=args.device,
        precision=args.precision,
        capacity=args.max_models,
        fast_path=args.fast_path,
        engine=args.engine,
        memory_limit=limit,
        loadable=loadable,
    )
    key = None
    if args.model or args.pretrained or args.checkpoint:
        loaded = store.load(
            ModelSource(
                model=args.model, pretrained=args.pretrained, checkpoint=args.checkpoint, img_size=args.img_size
            )
        )
        for note in loaded.notes:
            print(f"warning: {note}", file=sys.stderr)
        key = loaded.source.label
    # No telemetry and no update check; Gradio reads this when it is imported and when it launches.
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    gr = require_gradio()
    port = args.port or free_port(address, family)
    with tempfile.TemporaryDirectory(prefix="vitlab-serve-") as work:
        work_dir = Path(work)
        samples = save_samples(work_dir / "samples")
        page = build_page(store, runs_dir=args.runs, work_dir=work_dir, model=key, samples=samples)
        try:
            server = f"[{address}]" if family == socket.AF_INET6 else args.host  # Gradio's way to an IPv6 address
            page.launch(
                server_name=server,
                server_port=port,
                max_file_size=f"{args.max_upload_mb}mb",
                ssr_mode=False,
                share=False,
                quiet=True,
                prevent_thread_lock=True,
                theme=theme(),
                css=CSS,
                allowed_paths=[str(work_dir)],
                footer_links=["api", "settings"],
                show_error=False,
            )
        except OSError as e:
            raise VitlabError(
                f"cannot listen on {args.host}:{port}: the port is taken or not allowed; choose another "
                "--port, or leave it out for a free one"
            ) from e
        host = f"[{args.host}]" if ":" in args.host else ("127.0.0.1" if args.host == "0.0.0.0" else args.host)
        where = "this machine only" if args.host in ("127.0.0.1", "localhost", "::1") else f"listening on {args.host}"
        print(
            f"vitlab serve: http://{host}:{port}/ ({where}; model: {key or 'none yet, choose one in the page'}; "
            f"runs from {args.runs}/). Ctrl-C stops it.",
            flush=True,
        )
        if key is not None:
            threading.Thread(target=_say_path, args=(loaded,), daemon=True).start()
        with _stop_on_sigterm():
            try:
                while page.is_running:
                    time.sleep(0.2)
            except KeyboardInterrupt:
                pass
            finally:
                page.close()
                gr.close_all()
        print("vitlab serve: stopped", flush=True)
    return 0
