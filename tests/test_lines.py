"""`make test`'s sessions (tests/lines.py, run side by side by tests/run.sh) together run every test of the suite
once: each marker setup.cfg declares has its place, and pytest's own collection of each session's arguments,
as tests/run.sh passes them, splits the suite with nothing left over and nothing twice."""

import json
import sys

import lines
import pytest
from helpers import PORTS_VAR, free_port, run_in_checkout


def test_every_declared_marker_is_a_sessions_or_says_what_a_test_is():
    """A new marker in setup.cfg fails here, named, until tests/lines.py gives it a session or ANYWHERE."""
    placed = [m for markers in lines.SESSIONS.values() for m in markers] + list(lines.ANYWHERE)
    assert sorted(placed) == sorted(set(placed)), "a marker placed twice in tests/lines.py"
    assert set(lines.declared()) == set(placed), (
        f"declared in setup.cfg, not placed: {set(lines.declared()) - set(placed)}; "
        f"placed, not declared: {set(placed) - set(lines.declared())}"
    )


def test_the_expressions_claim_in_the_sessions_order():
    assert lines.expression("multinode") == "(multinode) and not (transformers4)"
    assert (
        lines.expression("single-node") == "(slurm or container) and not (transformers4 or multinode or demo or bench)"
    )
    assert (
        lines.expression(lines.REST)
        == "not (transformers4 or multinode or demo or bench or slurm or container or heavy)"
    )
    assert lines.arguments("compat")[:2] == ["-m", "compat or (transformers4)"]


# Collects what each session's arguments select, by pytest's own collection, in one process (what the test files
# import is imported once): {name: [exit code, node ids]} into the file argv[1].
COLLECT = """
import json, sys, pytest
class Selected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]
found = {}
for name, args in json.loads(sys.argv[2]).items():
    selected = Selected()
    code = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", *args], plugins=[selected])
    found[name] = [int(code), selected.ids]
open(sys.argv[1], "w").write(json.dumps(found))
"""


@pytest.mark.slow  # a pytest process collecting the suite nine times
def test_the_sessions_collect_every_test_once(tmp_path):
    """In the main venv every test is in one session of it, or is a transformers4 one that the compat session
    (the compat venv) runs; that session's files hold every test marked compat or transformers4."""
    mains = [name for name in [*lines.SESSIONS, lines.REST] if name != "compat"]
    asked = {name: lines.arguments(name) for name in [*lines.SESSIONS, lines.REST]}
    asked.update(whole=[], transformers4=["-m", "transformers4"], marked_compat=["-m", "compat"])
    r = run_in_checkout(sys.executable, "-c", COLLECT, tmp_path / "found.json", json.dumps(asked), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = json.loads((tmp_path / "found.json").read_text())
    assert {name: code for name, (code, _) in found.items()} == dict.fromkeys(asked, 0), r.stdout[-3000:]
    ids = {name: set(selected) for name, (_, selected) in found.items()}
    assert all(len(set(selected)) == len(selected) for _, selected in found.values())
    assert all(ids[name] for name in mains), {name: len(ids[name]) for name in mains}  # none selects nothing
    sessions = [ids[name] for name in mains] + [ids["transformers4"]]
    twice = {i for a in range(len(sessions)) for b in range(a) for i in sessions[a] & sessions[b]}
    assert not twice, sorted(twice)[:20]
    assert set().union(*sessions) == ids["whole"], sorted(ids["whole"] - set().union(*sessions))[:20]
    assert ids["compat"] == ids["transformers4"] | ids["marked_compat"], sorted(
        (ids["transformers4"] | ids["marked_compat"]) ^ ids["compat"]
    )[:20]


def test_each_session_takes_ports_from_a_block_of_its_own(monkeypatch):
    """The sessions' blocks (what tests/run.sh gives each, through `python tests/lines.py --ports`) meet
    nowhere and lie in 10000-19999, below the jobs' rendezvous ports; free_port draws only from its block."""
    names = [*lines.SESSIONS, lines.REST]
    printed = {
        name: run_in_checkout(sys.executable, "tests/lines.py", "--ports", name, timeout=60).stdout.strip()
        for name in names
    }
    assert printed == {name: lines.ports(name) for name in names}
    blocks = [range(int(low), int(high) + 1) for low, high in (block.split("-") for block in printed.values())]
    assert all(len(block) > 1000 for block in blocks) and min(blocks[0]) >= 10000 and max(blocks[-1]) < 20000
    assert sum(map(len, blocks)) == len(set().union(*blocks)), printed  # no port in two blocks
    monkeypatch.setenv(PORTS_VAR, printed["training"])
    assert {free_port() for _ in range(50)} <= set(blocks[names.index("training")])
