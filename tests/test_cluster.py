"""`vitlab reproduce --executor ray`: the grid's runs as tasks of a Ray cluster of two nodes on this machine
(loopback): both nodes train, the cache is the process pool's bitwise, and a node killed mid-grid costs time,
not runs. The cluster tests are slow (minutes; `pytest -m slow tests/test_cluster.py`) and need Ray, vitlab's
cluster extra: skipped with the install line as reason where it is missing, failing under CI=true, where
`.ci/run` installs it. The option checks and the missing-extra message run in the default suite."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import vitlab
from vitlab.cli import main
from vitlab.experiments.reproduce.claims import select
from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.runs import all_runs

RAY = Path(sys.executable).parent / "ray"  # the `ray` command of this environment
HOW = "needs Ray, vitlab's cluster extra: pip install -c constraints.txt -e '.[cluster]'"
TIMINGS = ("train_time_s", "train_cpu_s", "eval_time_s", "eval_cpu_s", "estimate_s")  # a run's result, but its clock


# ----------------------------------------------------------------------------------------------------
# Options and the missing extra (fast)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--address", "127.0.0.1:6379"],
            "error: --address 127.0.0.1:6379: an address is a Ray cluster's; use it with executor ray",
        ),
        (["--executor", "ray", "--address", "nohost"], "error: --address must be the head node's HOST:PORT"),
        (
            ["--executor", "ray", "--address", "127.0.0.1:6379", "--workers", "2"],
            "error: --workers 2: a Ray cluster runs as many runs at once as it has CPUs",
        ),
        (
            ["--executor", "ray", "--device", "cuda:1"],
            "error: --device cuda:1: with executor ray a run asks the cluster for "
            "a CPU or a whole GPU; use auto, cpu or cuda",
        ),
    ],
)
def test_cluster_options_are_checked_before_any_work(argv, expected, tmp_path, capsys):
    assert main(["reproduce", "--quick", *argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_without_ray_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    assert main(["reproduce", "--quick", "--executor", "ray", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --executor ray needs Ray, which is not installed: install vitlab's cluster extra, "
        "pip install -e '.[cluster]' (or: pip install -c constraints.txt ray)\n"
    )
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------------------------------
# Two Ray nodes on loopback (slow)


@pytest.fixture(scope="module")
def ray_installed() -> None:
    if importlib.util.find_spec("ray") is None or not RAY.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(HOW)
        pytest.skip(HOW)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    """The environment of the cluster's nodes and of the driver: the vitlab under test first on the path (the
    nodes' workers import it), a token of the test's own (Ray writes none to ~/.ray), no usage reports."""
    src = str(Path(vitlab.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        **extra,
    }


@contextlib.contextmanager
def _short_link(target: Path) -> Iterator[Path]:
    """A short path to `target`: a Ray node's sockets live in <temp>/session_<date>_<pid>/sockets/, and an
    AF_UNIX path has at most 107 bytes, more than a pytest folder leaves; the files stay in `target`."""
    target.mkdir(parents=True, exist_ok=True)
    link = Path(tempfile.gettempdir()) / f"vitlab-{secrets.token_hex(4)}"
    link.symlink_to(target, target_is_directory=True)
    try:
        yield link
    finally:
        link.unlink()
    left = _processes_of(link)
    assert not left, f"Ray processes of this test still running: {left}"


def _processes_of(folder: Path) -> list[str]:
    """The processes whose command line names `folder` (a Ray node's names its session folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
            if any(str(folder) + "/" in w for w in words):
                found.append(f"{cmdline.parent.name}: {' '.join(words)[:200]}")
    return found


class Cluster:
    """A Ray cluster of two nodes on this machine, each `ray start --block` in a process group of its own, so
    that a node can be stopped (SIGTERM: Ray stops its processes) or killed outright (SIGKILL to the group).

    Ray replaces the address 127.0.0.1 by the machine's network address (so that other machines could
    reach it); the nodes take other loopback addresses (127.0.0.2, 127.0.0.3), and nothing leaves this
    machine."""

    def __init__(self, root: Path, env: dict):
        self.root, self.env, self.port = root, env, _free_port()
        self.address = f"127.0.0.2:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()
        self.logs = contextlib.ExitStack()

    def start(self, name: str, ip: str, *args: str) -> None:
        log = self.logs.enter_context((self.root / f"{name}.log").open("w"))
        self.nodes[name] = subprocess.Popen(
            [
                str(RAY),
                "start",
                "--block",
                *args,
                "--node-ip-address",
                ip,
                "--num-cpus",
                "1",
                "--temp-dir",
                str(self.root / name),
                "--disable-usage-stats",
                "--object-store-memory",
                str(100 << 20),
                "--dashboard-agent-listen-port",
                str(_free_port()),
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> int:
        """The nodes the head counts as alive (`ray status`)."""
        out = subprocess.run(
            [str(RAY), "status", "--address", self.address], env=self.env, capture_output=True, text=True, timeout=120
        ).stdout
        active = out.split("Active:")[1].split("Pending:")[0] if "Active:" in out else ""
        return sum(line.strip().split(" ", 1)[0].isdigit() for line in active.splitlines() if "node_" in line)

    def wait_for(self, n: int, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            dead = [k for k, p in self.nodes.items() if p.poll() is not None and k not in self.killed]
            assert not dead, f"ray node {dead} stopped: " + (self.root / f"{dead[0]}.log").read_text()[-3000:]
            if self.alive() == n:
                return
            time.sleep(1)
        raise AssertionError(f"the Ray cluster did not reach {n} nodes in {timeout} s")

    def kill(self, name: str) -> None:
        """The node dies at once, as a machine that loses power: every process of it, SIGKILL."""
        os.killpg(self.nodes[name].pid, signal.SIGKILL)
        self.nodes[name].wait()
        self.killed.add(name)

    def stop(self) -> None:
        for p in reversed(list(self.nodes.values())):  # the worker first, then the head
            if p.poll() is None:
                p.terminate()  # `ray start --block` stops the node's processes, then itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=90)
            with contextlib.suppress(ProcessLookupError):  # whatever of the node is still there
                os.killpg(p.pid, signal.SIGKILL)
        self.logs.close()


@contextlib.contextmanager
def two_nodes(tmp: Path) -> Iterator[Cluster]:
    """`ray start --head --port P --num-cpus 1` and `ray start --address HEAD:P --num-cpus 1`, their
    session folders in `tmp`; stopped, every process of them, when the block ends."""
    with _short_link(tmp / "ray") as root:
        cluster = Cluster(root, _env())
        try:
            cluster.start(
                "head",
                "127.0.0.2",
                "--head",
                "--port",
                str(cluster.port),
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(_free_port()),
            )
            cluster.wait_for(1)
            cluster.start("worker", "127.0.0.3", "--address", cluster.address)
            cluster.wait_for(2)
            yield cluster
        finally:
            cluster.stop()


def _reproduce(out: Path, env: dict, *args: str) -> subprocess.Popen:
    """`vitlab reproduce --quick` in a process of its own (a Ray driver)."""
    return subprocess.Popen(
        [sys.executable, "-m", "vitlab", "reproduce", "--quick", "--no-progress", *args, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _runs(out: Path) -> dict[str, tuple[dict, bytes]]:
    """Every cached run: its result but the timings, and its weights' bytes."""
    runs = {}
    for folder in sorted((out / "cache" / "runs").iterdir()):
        result = json.loads((folder / "result.json").read_text())
        runs[folder.name] = (
            {k: v for k, v in result.items() if k not in TIMINGS},
            (folder / "checkpoints" / "final" / "model.safetensors").read_bytes(),
        )
    return runs


def _planned(only: str) -> list[str]:
    """The keys of the --quick grid's runs for the claims `only` names (2 seeds), as the plan lists them."""
    plan = [s for e in select(only) for s in e.plan(Scale("quick", (0, 1)))]
    return sorted(s.key for s in all_runs(plan))


@pytest.fixture(scope="module")
def pool_runs(tmp_path_factory, fashion, ray_installed) -> dict:
    """The --quick grid on the process pool (2 workers, one thread each): the reference."""
    out = tmp_path_factory.mktemp("pool") / "r"
    assert main(["reproduce", "--quick", "--no-progress", "--workers", "2", "--out", str(out)]) == 0
    return _runs(out)


@pytest.mark.slow
def test_reproduce_on_two_ray_nodes_is_the_pool_bitwise(tmp_path, pool_runs):
    out = tmp_path / "r"
    with two_nodes(tmp_path) as cluster:
        driver = _reproduce(out, cluster.env, "--executor", "ray", "--address", cluster.address)
        log, _ = driver.communicate(timeout=1800)
    assert driver.returncode == 0, log[-5000:]
    runs = _runs(out)
    assert sorted(runs) == sorted(pool_runs)
    different = [k for k in runs if runs[k] != pool_runs[k]]
    assert not different, f"{len(different)} of {len(runs)} runs differ from the pool's: {different[:5]}"
    trained = json.loads((out / "cache" / "invocation.json").read_text())
    assert trained["executor"] == "ray" and trained["trained"] == len(runs)
    assert f"the Ray cluster at {cluster.address}: 2 node(s), 2 CPU(s)" in trained["cluster"]
    nodes = trained["nodes"]  # runs per node, as the tasks reported where they ran
    assert sorted(n.split(" ")[0] for n in nodes) == ["127.0.0.2", "127.0.0.3"], nodes
    assert all(n > 0 for n in nodes.values()) and sum(nodes.values()) == len(runs), nodes
    assert f"worker(s) on the Ray cluster at {cluster.address}" in (out / "report.md").read_text()
    assert "run(s) on 127.0.0.3" in log


@pytest.mark.slow
def test_a_node_killed_mid_grid_costs_no_run(tmp_path, pool_runs):
    """The worker node dies (every process of it killed at once) while it trains: its runs go to the head,
    the grid completes with the pool's numbers, and no run that was already kept is trained again."""
    out = tmp_path / "r"
    cache = out / "cache" / "runs"
    with two_nodes(tmp_path) as cluster:
        driver = _reproduce(out, cluster.env, "--executor", "ray", "--address", cluster.address, "--only", "1,6")
        end = time.monotonic() + 900
        while len(list(cache.glob("*/result.json"))) < 2 and driver.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert driver.poll() is None, "the grid ended before a node could be killed: " + driver.communicate()[0][-3000:]
        kept = {p: p.stat().st_mtime_ns for p in cache.glob("*/result.json")}
        cluster.kill("worker")
        log, _ = driver.communicate(timeout=1800)
        cluster.wait_for(1)  # the head has noticed: one node left
    assert driver.returncode == 0, log[-5000:]
    runs = _runs(out)
    assert sorted(runs) == _planned("1,6") and all(runs[k] == pool_runs[k] for k in runs)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # written once: nothing kept was trained again
    trained = json.loads((out / "cache" / "invocation.json").read_text())
    assert trained["trained"] == sum(trained["nodes"].values()) == len(runs)  # each run came back once
    assert any(n.startswith("127.0.0.2 ") for n in trained["nodes"]), trained["nodes"]


@pytest.mark.slow
def test_a_ray_cluster_of_this_machine_alone(tmp_path, pool_runs):
    """Without --address: a Ray cluster of this machine, started for the grid and stopped after it; its
    files under vitlab's cache folder, nothing in the home folder. (Ray keeps such a cluster on 127.0.0.1
    only where told that it will have no other node: the variable below, set for the test.)"""
    out, home = tmp_path / "r", tmp_path / "home"
    home.mkdir()
    with _short_link(tmp_path / "cache") as cache:
        env = _env(VITLAB_CACHE=str(cache), HOME=str(home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):  # Ray's defaults for a new cluster: a token, in ~/.ray
            env.pop(name)
        driver = _reproduce(out, env, "--executor", "ray", "--workers", "2", "--only", "6")
        log, _ = driver.communicate(timeout=1800)
    assert driver.returncode == 0, log[-5000:]
    runs = _runs(out)
    assert sorted(runs) == _planned("6") and all(runs[k] == pool_runs[k] for k in runs)
    assert "a Ray cluster of this machine: 1 node(s), 2 CPU(s)" in log and "run(s) on 127.0.0.1" in log
    assert [p.name.startswith("session_") for p in (tmp_path / "cache" / "ray").iterdir() if p.is_dir()] == [True]
    assert not (home / ".ray").exists()  # no ~/.ray/auth_token: the cluster's token lived in its processes
