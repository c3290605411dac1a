"""The README cannot drift from the command line: every shell and Python block marked as runnable runs
here, as written, in a fresh folder, with `.venv/bin` (this interpreter's folder) first on the PATH.

A block is marked by an HTML comment on the line before its opening fence:

    <!-- readme-test: run -->                 run it: a bash block line by line, a block of output its
                                              `$ command` lines, a Python block as one script
    <!-- readme-test: run id=NAME -->         ... and remember its folder as NAME
    <!-- readme-test: run after=NAME -->      ... in the folder of block NAME (the next step of a sequence)
    <!-- readme-test: skip REASON -->         not run, and why (a benchmark, real weights, a server)

Two more attributes of `run`: `shorten="OLD=>NEW;OLD2=>NEW2"` replaces text in the commands (fewer
epochs: the README shows the full run, the test checks the command works), and `leave="PREFIX"` leaves
out the lines that start with PREFIX.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(run|skip)\b(.*?)-->")
TIME_LIMIT = 240  # seconds per command


def blocks() -> list[dict]:
    """Every fenced block of the README, with the marker on the line before it (or none)."""
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        marker = MARKER.search(lines[i - 1]) if i > 0 else None
        attrs = (
            dict((k, v1 or v2) for k, v1, v2 in re.findall(r'(\w+)=(?:"([^"]*)"|(\S+))', marker.group(2)))
            if marker
            else {}
        )
        out.append(
            {
                "lang": fence.group(1),
                "body": lines[i + 1 : j],
                "line": i + 1,
                "mode": marker.group(1) if marker else None,
                "attrs": attrs,
                "reason": marker.group(2).strip() if marker else "",
            }
        )
        i = j + 1
    return out


def _joined(lines: list[str]) -> list[str]:
    """Lines with their backslash continuations joined."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    return out


def commands(block: dict) -> list[str]:
    """The commands of a block: its `$ ...` lines when it has any (the rest is their output), else
    every line that is not blank or a comment; then `shorten` and `leave` applied."""
    body = _joined(block["body"])
    prompted = [line[2:] for line in body if line.startswith("$ ")]
    cmds = prompted or [line for line in body if line.strip() and not line.lstrip().startswith("#")]
    for pair in filter(None, block["attrs"].get("shorten", "").split(";")):
        old, new = pair.split("=>")
        assert any(old in c for c in cmds), f"README line {block['line']}: shorten {old!r} matches no command"
        cmds = [c.replace(old, new) for c in cmds]
    leave = block["attrs"].get("leave")
    return [c for c in cmds if not (leave and c.startswith(leave))]


def _is_code(block: dict) -> bool:
    return block["lang"] in ("bash", "sh", "python") or any(line.startswith("$ ") for line in block["body"])


RUNNABLE = [b for b in blocks() if b["mode"] == "run"]


def test_every_code_block_is_marked_and_every_skip_says_why():
    """A block without a marker would drift silently: each one runs here or says why not."""
    unmarked = [b["line"] for b in blocks() if b["mode"] is None and _is_code(b)]
    assert not unmarked, f"README.md code blocks without a readme-test marker, at lines {unmarked}"
    assert all(len(b["reason"]) > 20 for b in blocks() if b["mode"] == "skip")
    assert len(RUNNABLE) >= 4


def test_the_readme_opens_with_exactly_the_two_commands():
    first = blocks()[0]
    assert first["body"] == ["make demo", "make test"]
    assert README.read_text().index("```") < README.read_text().index("\n## ")


@pytest.fixture(scope="module")
def folders() -> dict:
    return {}


# A block marked `slow="why"` runs with the slow tests (`make test ARGS="-m slow"`, as CI runs them), and so does every
# block that runs after it.
SLOW = {b["attrs"]["id"] for b in RUNNABLE if "slow" in b["attrs"] and "id" in b["attrs"]}


def _param(block: dict):
    slow = "slow" in block["attrs"] or block["attrs"].get("after") in SLOW
    return pytest.param(block, id=f"line{block['line']}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("block", [_param(b) for b in RUNNABLE])
def test_readme_block_runs(block, folders, tmp_path):
    after = block["attrs"].get("after")
    if after is not None and after not in folders:
        pytest.fail(f"README line {block['line']}: block {after!r} did not run first")
    cwd = folders[after] if after else tmp_path
    if "id" in block["attrs"]:
        folders[block["attrs"]["id"]] = cwd
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
    }
    if block["lang"] == "python":
        script = cwd / "readme_snippet.py"
        script.write_text("\n".join(block["body"]) + "\n")
        done = subprocess.run(
            [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIME_LIMIT
        )
        assert done.returncode == 0, f"README line {block['line']}: {done.stderr[-2000:]}"
        return
    cmds = commands(block)
    assert cmds, f"README line {block['line']}: a runnable block without commands"
    for cmd in cmds:
        done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIME_LIMIT)
        assert done.returncode == 0, (
            f"README line {block['line']}: `{cmd}` failed ({done.returncode}):\n{done.stderr[-2000:]}"
        )
