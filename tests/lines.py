"""Which session of `make test` runs which tests: each session's markers, from those setup.cfg declares.

A session runs the tests that carry one of its markers and none of an earlier session's; `rest` runs the tests
no session claims. The other markers say what a test needs or is, not where it runs (ANYWHERE): such a test
runs where its other markers put it. Every marker setup.cfg declares is a session's or in ANYWHERE, so a new
marker is placed on purpose: tests/test_lines.py checks that, and that the sessions together collect every
test of the suite once. tests/run.sh groups the sessions into lines that run side by side.

    python tests/lines.py SESSION            the session's pytest arguments, one a line (what tests/run.sh runs)
    python tests/lines.py --ports SESSION    the session's block of ports, LOW-HIGH (helpers.free_port's)
"""

import configparser
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The sessions in the order they claim tests, each with its markers. `compat` runs in the compat venv
# (transformers 4.x, `make test-compat`): the tests whose oracle only 4.x has, which the main venv leaves to it,
# and the tests marked `compat` again (the main venv runs those too), over COMPAT_FILES.
SESSIONS = {
    "compat": ("transformers4",),
    "multinode": ("multinode",),  # the 2-node cluster of network namespaces
    "demo": ("demo",),  # make demo's recipe, trained for its F1 floor
    "bench": ("bench",),
    "single-node": ("slurm", "container"),  # the single-node Slurm, the Container Engine's stand-in, Charliecloud
    "training": ("heavy",),  # the files that train the most
}
REST = "rest"
# What a test needs or is, not where it runs.
ANYWHERE = ("slow", "mpi", "oracle", "gpu", "cpu", "compat")
# What the floor line must do (the tests marked compat there, on every requirement's floor): train in every shipped
# config a CPU runs, on 1 and 2 ranks, resume across world sizes, evaluate, export, answer, load and label every
# encoder family its transformers has and refuse the newer ones naming the release they need, and have the pinned
# venv; and the SQuAD v2.0 oracle's tests.
COMPAT_FILES = [
    "tests/test_train.py",
    "tests/test_resume.py",
    "tests/test_resume_anywhere.py",
    "tests/test_compiling.py",
    "tests/test_evaluate.py",
    "tests/test_answer.py",
    "tests/test_families.py",
    "tests/test_pins.py",
    "tests/test_metrics.py",
    "tests/test_score_cli.py",
]


def declared() -> list:
    """The markers setup.cfg declares for pytest, in its order."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return [line.split(":")[0].strip() for line in setup["tool:pytest"]["markers"].strip().splitlines()]


def expression(session: str) -> str:
    """The -m expression of the tests `session` claims: its markers, none of an earlier session's (for `rest`:
    none of any session's)."""
    names = list(SESSIONS)
    before = names if session == REST else names[: names.index(session)]
    earlier = " or ".join(m for name in before for m in SESSIONS[name])
    if session == REST:
        return f"not ({earlier})"
    own = " or ".join(SESSIONS[session])
    return f"({own}) and not ({earlier})" if earlier else f"({own})"


# The ports the tests listen on (helpers.free_port): 10000-19999, below the jobs' rendezvous ports and the
# ephemeral ones, in a block for each session. Sessions run side by side, and one could otherwise take a port
# that another has just found free and not yet listened on.
PORTS_LOW, PORTS_HIGH = 10000, 19999


def ports(session: str) -> str:
    """`session`'s block of ports, as LOW-HIGH: an equal share of PORTS_LOW-PORTS_HIGH, by its place in SESSIONS
    (`rest` last)."""
    names = [*SESSIONS, REST]
    width = (PORTS_HIGH + 1 - PORTS_LOW) // len(names)
    low = PORTS_LOW + width * names.index(session)
    return f"{low}-{low + width - 1}"


def arguments(session: str) -> list:
    """The pytest arguments of `session`: its expression; `compat` its own (see SESSIONS) and its files."""
    if session == "compat":
        return ["-m", f"compat or {expression('compat')}", *COMPAT_FILES]
    return ["-m", expression(session)]


if __name__ == "__main__":
    asked = sys.argv[1:]
    if asked[:1] == ["--ports"]:
        asked = asked[1:]
    if len(asked) != 1 or asked[0] not in [*SESSIONS, REST]:
        sys.exit(f"usage: python tests/lines.py [--ports] {{{','.join([*SESSIONS, REST])}}}")
    print(ports(asked[0]) if "--ports" in sys.argv else "\n".join(arguments(asked[0])))
