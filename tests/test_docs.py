"""The command line's own help, and the documentation site built from docs/.

`vitlab --help` lists the commands in the order a newcomer meets them, one line each, and every
command's help ends with an example that parses. The site builds with `mkdocs build --strict` (a broken
link, a missing anchor, a page left out of the navigation or an API page that fails stops it), and its
command-line reference lists every command and every option that `vitlab COMMAND --help` prints.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import vitlab
from vitlab.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
NEWCOMER_ORDER = [
    "demo",
    "data",
    "train",
    "predict",
    "attention",
    "finetune",
    "export",
    "serve",
    "info",
    "inspect",
    "reproduce",
    "bench",
    "tune",
]
DATA_COMMANDS = ["digits", "fashion-mnist", "scan"]
EVERY_COMMAND = [[c] for c in NEWCOMER_ORDER] + [["data", w] for w in DATA_COMMANDS]


def help_text(argv: list[str], capsys, monkeypatch) -> str:
    """What `vitlab ARGV --help` prints in a terminal of 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_vitlab_help_lists_the_commands_in_a_newcomers_order_one_line_each(capsys, monkeypatch):
    text = help_text([], capsys, monkeypatch)
    listed = re.findall(r"^  ([a-z]+)  +(\S.*)$", text, flags=re.M)
    assert [name for name, _ in listed] == NEWCOMER_ORDER == list(COMMANDS)
    for name, line in listed:
        assert line == COMMANDS[name]  # the whole summary on its one line
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.rstrip().endswith("example:\n  vitlab demo")


def test_vitlab_help_and_a_mistyped_command_answer_without_loading_torch_or_any_command():
    """`vitlab --help`, `vitlab` and `vitlab NOSUCH` load no command module; a named
    command loads its own module and no other."""
    names = list(COMMANDS)
    code = (
        "import sys\n"
        "from vitlab.cli import main\n"
        "for argv in (['--help'], [], ['nosuch'], ['--version']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"loaded = sorted(m for m in sys.modules if m == 'torch' or m[:11] == 'vitlab.cli.' and m[11:] in {names!r})\n"
        "print('LOADED', loaded)\n"
        "main(['data', '--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert "LOADED []" in out, out[-2000:]
    assert "usage: vitlab data" in out and "invalid choice: 'nosuch'" in done.stderr


def test_every_commands_help_answers_without_loading_torch():
    """`vitlab COMMAND --help` builds its parser from `vitlab.options` and the recipes, never the library that acts
    on them: no torch, NumPy, PIL or matplotlib is imported (seconds on a busy machine), and the help is whole."""
    code = (
        "import contextlib, io, sys\n"
        "from vitlab.cli import main\n"
        f"for argv in {EVERY_COMMAND!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([*argv, '--help'])\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    heavy = [m for m in ('torch', 'numpy', 'PIL', 'matplotlib', 'torchvision') if m in sys.modules]\n"
        "    print(' '.join(argv), out.getvalue().count('example:'), heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"{' '.join(argv)} 1 []" for argv in EVERY_COMMAND], done.stdout


def test_the_options_the_parsers_read_are_the_librarys_own(capsys, monkeypatch):
    """What `--help` reads from `vitlab.options` is what the library acts on: the bundled datasets, the claims of
    `vitlab reproduce` (each module claim<N>_<name> with its EXPERIMENT numbered N and named so), the Fashion-MNIST
    class folders the help of `vitlab data fashion-mnist` names."""
    from vitlab.data.datasets import BUNDLED
    from vitlab.data.fashion_mnist import FOLDER_NAMES
    from vitlab.experiments.reproduce import EXPERIMENTS
    from vitlab.options import CLAIMS, DATASETS

    assert tuple(BUNDLED) == DATASETS
    assert [(e.number, e.name) for e in EXPERIMENTS] == list(CLAIMS.items())
    text = help_text(["data", "fashion-mnist"], capsys, monkeypatch)
    assert f"({FOLDER_NAMES[0]} .. {FOLDER_NAMES[-1]})" in " ".join(text.split())


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=" ".join)
def test_every_commands_help_ends_with_one_example_that_parses(argv, capsys, monkeypatch):
    lines = help_text(argv, capsys, monkeypatch).rstrip().splitlines()
    assert lines[-2] == "example:" and lines[-1].startswith("  vitlab ")
    example = shlex.split(lines[-1])
    args = build_parser().parse_args(example[1:])  # a valid command line of this very command
    assert args.command == argv[0] and (len(argv) == 1 or args.data_command == argv[1])


def _docs_missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return f"the docs extra is not installed ({module} is missing): pip install -c constraints.txt -e '.[docs]'"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    why = _docs_missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the documentation must build in CI: {why}")
        pytest.skip(why)
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


def _sections(page: Path) -> dict[str, str]:
    """The text of each h2/h3 section of a built page, by the section's id."""
    body = page.read_text().split("<article", 1)[1].split("</article>", 1)[0]
    parts = re.split(r'<h[23] id="([^"]+)"', body)
    text = lambda s: html.unescape(re.sub(r"<[^>]+>", "", s))  # noqa: E731
    return {parts[i]: text(parts[i + 1]) for i in range(1, len(parts) - 1, 2)}


def test_the_site_builds_strict_with_every_page_in_its_navigation(site):
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:  # each Markdown page became a page of the site
        stem = page.removesuffix(".md").removesuffix("README").removesuffix("index").rstrip("/")
        assert (site / stem / "index.html").is_file(), page
    assert (site / "index.html").is_file() and not (site / "hooks").exists()
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()  # nothing fetched from elsewhere


def test_the_cli_page_lists_every_command_and_every_option_of_its_help(site, capsys, monkeypatch):
    sections = _sections(site / "cli" / "index.html")
    for argv in [[]] + EVERY_COMMAND:
        printed = help_text(argv, capsys, monkeypatch)
        section = sections["-".join(["vitlab", *argv])]
        assert printed.strip() in section  # the page shows what --help prints, verbatim
        options = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", printed))
        assert {"-h", "--help"} <= options
        assert not [o for o in options if o not in section], argv


def test_the_api_page_documents_every_public_name(site):
    page = (site / "api" / "index.html").read_text()
    public = [n for n in vitlab.__all__ if callable(getattr(vitlab, n)) and not n.startswith("_")]
    assert len(public) >= 10
    assert not [n for n in public if f'id="vitlab.{n}"' not in page]


# Words of how the software was made, which a user cannot look up: a tracker's numbers, "the issue's ...".
PROCESS_WORDS = re.compile(r"\bissues? #?\d+|\bthe issue's\b|\b(this|previous|last|earlier) session\b", re.IGNORECASE)


def _texts_users_read():
    for pattern in (
        "README.md",
        "CONTRIBUTING.md",
        "docs/**/*.md",
        "docs/**/*.html",
        "src/**/*.py",
        "src/**/*.json",
        "benchmarks/*.py",
        "tests/*.py",
    ):
        for path in sorted(ROOT.glob(pattern)):
            if path != Path(__file__).resolve():
                yield path


def test_the_docs_and_code_speak_of_the_software_not_of_its_making():
    found = [
        f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
        for p in _texts_users_read()
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        for m in PROCESS_WORDS.finditer(line)
    ]
    assert not found, "process words in the docs or the code:\n" + "\n".join(found)


def test_the_process_words_check_finds_them():
    assert PROCESS_WORDS.search("the setup before issue 28") and PROCESS_WORDS.search("over the issue's 2 hours")
    assert not PROCESS_WORDS.search("it must stop growing after the first round of requests")
