"""Fixtures and the tier policy: the shipped sample data, a tiny BERT built offline from it, the test
clusters, and which skips fail a run that must run everything. Helpers the tests import are in helpers.py."""

import os
import shutil
import signal

import preloaded
import pytest
from helpers import HARDWARE_CAUSE, gpu_count, sample_path, skip_for_hardware

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# --- tiers ---------------------------------------------------------------------------------------------
# The markers are declared in setup.cfg (--strict-markers). A run that must run everything (make test, whose
# tests/run.sh sets BERT_SQUAD_REQUIRE_ALL=1 unless it is 0; CI, which runs .ci/run with CI=true; or
# BERT_SQUAD_REQUIRE_ALL=1 by hand) turns every skip into a failure that names its reason,
# except a skip whose cause is the machine's hardware (helpers.skip_for_hardware: no GPU for the `gpu` tier,
# a GPU for the `cpu` tier, one GPU for two ranks). Root, mpirun, the Debian and Python packages and
# ../shared are set-up, not hardware: `make test` as root provides them, and their absence fails such a run.


def require_all():
    """Whether this run must run every tier: CI is set (and not 'false'/'0'), or BERT_SQUAD_REQUIRE_ALL=1."""
    value = os.environ.get("BERT_SQUAD_REQUIRE_ALL", "")
    if value not in ("", "0", "1"):
        raise pytest.UsageError(f"BERT_SQUAD_REQUIRE_ALL={value}: use 1 (every tier must run) or 0")
    return value == "1" or os.environ.get("CI", "").lower() not in ("", "0", "false")


_REQUIRE_ALL = pytest.StashKey[bool]()
_TIERS = pytest.StashKey[frozenset]()


def pytest_configure(config):
    config.stash[_REQUIRE_ALL] = require_all()
    if config.stash[_REQUIRE_ALL]:
        # A fresh clone has no example database, so a rare counterexample drawn by chance would be a flake:
        # a run that must run everything draws the same examples each time (other runs keep drawing new ones).
        # Loaded before the test modules are imported, so their own @settings inherit it.
        from hypothesis import settings

        settings.register_profile("require-all", derandomize=True, database=None)
        settings.load_profile("require-all")
    config.stash[_TIERS] = frozenset(line.split(":")[0].strip() for line in config.getini("markers"))
    # A CI timeout or a kill ends the session with SIGTERM: raised as an interrupt, it still runs every
    # `finally` and fixture teardown, so no rank, daemon, namespace or mount outlives the session.
    signal.signal(signal.SIGTERM, _interrupt)
    # DeepSpeed's logger writes to the sys.stdout of the moment it is first imported. Imported here, that is
    # the session's; imported inside a test that captures output, it would be that test's stream, closed
    # afterwards, and every later in-process run would print a logging-error traceback. The process is set up
    # first, as the CLI sets up its own, so that the import does not warn about a missing GPU.
    from bert_squad import runtime

    runtime.prepare()
    import deepspeed  # noqa: F401


def pytest_sessionstart(session):
    """The session's environment as pytest_configure set it up: what forked CLI runs start from (preloaded.py),
    where no GPU is visible."""
    preloaded.session_started(gpu_count())


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_runtest_setup(item):
    """Skip, with the reason, what this machine cannot run: the hardware tiers, and mpirun where it is missing."""
    if item.get_closest_marker("gpu") and not gpu_count():
        skip_for_hardware("needs a CUDA or ROCm GPU: torch sees none on this host")
    if item.get_closest_marker("cpu") and gpu_count():
        skip_for_hardware(
            f"assumes a CPU-only host (fp16 refused, gloo, device cpu); torch sees {gpu_count()} "
            "GPU(s) here: the gpu tier covers this host"
        )
    if item.get_closest_marker("mpi") and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (make test installs Open MPI from Debian when run as root)")
    if item.get_closest_marker("mpi") and gpu_count() == 1:
        skip_for_hardware("two ranks on one host need its CPU or two GPUs (NCCL takes a GPU per rank); this host has 1")


def pytest_collection_modifyitems(items):
    """The clusters' own tests (test_fixtures.py) first: they start and break clusters of their own, which
    they cannot while this session's shared one (a session fixture) is up."""
    items.sort(key=lambda item: item.path.name != "test_fixtures.py")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a run that must run everything, a skip for any cause but the hardware is a failure naming its reason."""
    report = (yield).get_result()
    if not (report.skipped and item.config.stash[_REQUIRE_ALL]) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if HARDWARE_CAUSE in reason:
        return
    tiers = {m.name for m in item.iter_markers()} & item.config.stash[_TIERS]
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in a run that must run every tier (make test, CI or BERT_SQUAD_REQUIRE_ALL=1; outside CI, "
        f"BERT_SQUAD_REQUIRE_ALL=0 asks for a partial run; tiers of this test: {', '.join(sorted(tiers)) or 'none'})"
        f": {reason}"
    )


@pytest.fixture(scope="session")
def sample_train():
    return sample_path("train-v1.1.json")


@pytest.fixture(scope="session")
def sample_dev():
    return sample_path("dev-v1.1.json")


@pytest.fixture(scope="session")
def sample_dev_v2():
    return sample_path("dev-v2.0.json")


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """`tiny_family(name)`: the tiny model of an encoder family (tests/tiny_models.py), built once a session and
    shared by every test that asks for it (one that changes a model's files changes a copy)."""
    from tiny_models import build_tiny_model

    built = {}

    def tiny(family):
        if family not in built:
            built[family] = build_tiny_model(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return built[family]

    return tiny


@pytest.fixture(scope="session")
def tiny_model(tiny_family):
    """A randomly initialised 2-layer BERT whose WordPiece vocabulary is trained on the sample: it loads
    offline and trains in seconds (tests/tiny_models.py builds the other families the same way)."""
    return tiny_family("bert")


@pytest.fixture(scope="session")
def tiny_eurobert(tiny_family):
    """A tiny EuroBERT saved as its hub checkpoints are (encoder and masked-LM head): an encoder transformers
    ships without a question-answering class, so it trains with the project's span head."""
    import transformers
    from packaging.version import Version

    from bert_squad.model import family

    assert Version(transformers.__version__) >= Version(family("eurobert").since), "EuroBERT needs a newer transformers"
    return tiny_family("eurobert")


# A real single-node Slurm (session fixture `slurm_cluster`), shared by the launch and sweep tests, a real
# multi-node one of network namespaces on this machine (`multinode_cluster`, tests/test_multinode.py), and the
# Container Engine's stand-in (tests/test_edf_contract.py).
from ce_cluster import ce_cluster, ce_image, ce_srun  # noqa: E402,F401
from slurm_cluster import multinode_cluster, slurm_cluster  # noqa: E402,F401
