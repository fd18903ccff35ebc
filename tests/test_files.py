"""Files on a file system that many ranks share: what one rank writes or probes must not be another's."""

import shutil
import subprocess
import time

import pytest
from helpers import PYTHON, ROOT

# Probes the folder `count` times once `go` exists; says its PID first (in `said`), and what failed, if anything.
PROBER = r"""
import os, sys, time
from pathlib import Path
from bert_squad.files import probe_write
folder, go, said, count = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
said.write_text(str(os.getpid()))
deadline = time.monotonic() + 120
while not go.exists():  # both start probing together
    assert time.monotonic() < deadline, "never told to go"
    time.sleep(0.001)
for _ in range(count):
    probe_write(folder)
"""


@pytest.mark.slow
def test_two_processes_of_the_same_pid_probe_one_folder_at_once(tmp_path):
    """Ranks on two nodes booted alike, or in containers with PID namespaces of their own, can have the same PID
    and probe the same shared output dir at the same moment: here two processes, each PID 1 of a PID namespace
    of its own, probe one folder a thousand times each, together. Neither fails, and nothing is left behind."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux; make test installs it as root)")
    folder, go = tmp_path / "shared", tmp_path / "go"
    folder.mkdir()
    said = [tmp_path / f"pid-{i}" for i in range(2)]
    in_own_pid_namespace = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]
    probers = [
        subprocess.Popen(
            [*in_own_pid_namespace, PYTHON, "-c", PROBER, str(folder), str(go), str(path), "1000"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in said
    ]
    try:
        while not all(path.exists() and path.read_text() for path in said):
            assert all(p.poll() is None for p in probers), [p.communicate(timeout=60) for p in probers]
            time.sleep(0.01)
        go.touch()
        done = [p.communicate(timeout=120) for p in probers]
    finally:
        for p in probers:
            p.kill()
    if any("unshare failed" in err for _, err in done):
        pytest.skip(f"no PID namespace here: {done}")
    assert [p.returncode for p in probers] == [0, 0], done
    assert [path.read_text() for path in said] == ["1", "1"]  # the same PID
    assert list(folder.iterdir()) == []
