"""A run's ranks meet at their rendezvous, as a command's process group does (`distributed.detect`, then
`distributed.rendezvous`), and do nothing else: no training, so that many runs can share a small host.

    python tests/rendezvous_only.py FOLDER COUNT

Each rank puts in its run's store which run its launcher says it belongs to (the step srun gave it, or the PMIx
namespace mpirun gave it: the launcher's own variables, not `distributed.run_name`), reads every rank's, and
writes FOLDER/<run>.<rank>.json: {"run", "rank", "port", "seen"}. It then keeps its store open until COUNT
records are in FOLDER, so the runs that share that folder all hold their ports at once. A rendezvous that
fails is one line, `rendezvous_only: error: ...`, and exit code 2.
"""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from bert_squad import distributed
from bert_squad.errors import UserError, exit_code
from bert_squad.files import write_json_atomic

WAIT = 180  # seconds for the rendezvous, and for the other runs' records


def launcher_run():
    """The run as its launcher tells it: mpirun's PMIx namespace, else srun's step."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return f"mpirun-{os.environ['PMIX_NAMESPACE']}"
    return f"step-{os.environ['SLURM_STEP_ID']}"


def main():
    folder, count = Path(sys.argv[1]), int(sys.argv[2])
    dist, mine = distributed.detect(), launcher_run()
    store = distributed.rendezvous(dist, timedelta(seconds=WAIT))
    store.set(f"launcher-run/{dist.rank}", mine)
    seen = [store.get(f"launcher-run/{rank}").decode() for rank in range(dist.world_size)]
    write_json_atomic(
        folder / f"{mine}.{dist.rank}.json", {"run": mine, "rank": dist.rank, "port": store.port, "seen": seen}
    )
    deadline = time.monotonic() + WAIT
    while len(list(folder.glob("*.json"))) < count:
        if time.monotonic() > deadline:
            raise UserError(f"{folder}: {len(list(folder.glob('*.json')))} records of {count} after {WAIT}s")
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(exit_code(main, "rendezvous_only"))
