"""vitlab.runtime's pools of worker processes: a parent killed without a word takes its workers with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from vitlab.runtime import process_pool

    with process_pool(2) as pool:
        futures = [pool.submit(time.sleep, 120) for _ in range(2)]
        while len(pool._processes or {}) < 2:
            time.sleep(0.05)
        print(" ".join(str(p) for p in pool._processes), flush=True)
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended; it waits for init to reap it
    except FileNotFoundError:
        return False


def test_pool_workers_end_when_their_parent_is_killed(tmp_path):
    env = {**os.environ, "VITLAB_CACHE": str(tmp_path / "cache")}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = parent.stdout.readline()  # the workers' pids, once both have started
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers), line
        parent.send_signal(signal.SIGKILL)  # no chance to stop the pool
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers), f"workers {workers} outlived their killed parent"
    finally:
        parent.kill()
        for p in workers if "workers" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
