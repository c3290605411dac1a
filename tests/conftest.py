"""What several test files share: a private vitlab cache folder for the session, and Fashion-MNIST's
files (a skip that says how to get them when they are missing; a failure under CI=true, where
`.ci/run` installs them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vitlab.data import fashion_mnist
from vitlab.errors import VitlabError

HOW = (
    "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), or set VITLAB_DATA "
    "to a folder with its four idx files"
)


# The real cache root, as it is before any test runs: no test may create it (everything vitlab writes outside
# --out goes under VITLAB_CACHE, which the session points at a temporary folder).
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitlab"
USER_CACHE_EXISTED = USER_CACHE.exists()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if the tests created the user's own vitlab cache folder (checked where it did not exist
    before, as on a fresh machine or in CI)."""
    if not USER_CACHE_EXISTED and USER_CACHE.exists() and not hasattr(session.config, "workerinput"):
        print(f"\nerror: the tests wrote {USER_CACHE}: something vitlab writes ignores VITLAB_CACHE")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory) -> Path:
    """vitlab's cache folder (where Fashion-MNIST's .gz files are decompressed) in the session's temporary
    folder, not in the home folder; subprocesses inherit it."""
    old = os.environ.get("VITLAB_CACHE")
    path = tmp_path_factory.mktemp("vitlab_cache")
    os.environ["VITLAB_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("VITLAB_CACHE", None)
    else:
        os.environ["VITLAB_CACHE"] = old


@pytest.fixture(scope="session")
def fashion(private_cache) -> Path:
    """The folder of Fashion-MNIST's checked, uncompressed idx files."""
    try:
        return fashion_mnist.locate(download=False)
    except VitlabError:
        message = f"needs Fashion-MNIST's files, which are not on this machine: {HOW}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def one_thread():
    """Two shared cores: one intra-op thread is faster here and the same in the subprocesses (the test
    files that train ask for it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
