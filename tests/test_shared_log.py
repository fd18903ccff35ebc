"""Ranks share one log (mpirun's output, a Slurm job's file): what each prints must reach it in whole lines."""

import os
import re
import subprocess

from helpers import PYTHON

LINES = 3000
# A rank that has set its process up as every command does, then prints as much as a long run's ranks do.
RANK = f"""
import os, sys
from bert_squad import runtime
runtime.prepare()
for i in range({LINES}):
    print(f"rank {{sys.argv[1]}} pid {{os.getpid()}} line {{i}} master node1:29500", flush=True)
"""


def test_ranks_printing_at_once_into_one_log_leave_every_line_whole(tmp_path):
    """Four ranks print at once into one file, unbuffered as the job scripts run Python: every line arrives
    whole (an unbuffered stream writes a line's text and its newline apart, and other ranks' lines fall in
    between)."""
    log = tmp_path / "log"
    with open(log, "ab") as shared:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        ranks = [subprocess.Popen([PYTHON, "-c", RANK, str(r)], stdout=shared, env=env) for r in range(4)]
        assert [rank.wait(timeout=300) for rank in ranks] == [0] * 4
    lines = log.read_text().splitlines()
    broken = [line for line in lines if not re.fullmatch(r"rank [0-3] pid \d+ line \d+ master node1:29500", line)]
    assert len(lines) == 4 * LINES and not broken, broken[:5]
