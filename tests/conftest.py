"""Shared fixtures and helpers: the shipped sample data, a tiny BERT built offline from it, processes that
cannot outlive their test, and the tier policy (which skips fail a run that must run everything)."""

import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # 3.9 and 3.10: the same parser as a package (setup.cfg's test extra)
    import tomli as tomllib  # noqa: F401


ROOT = Path(__file__).resolve().parents[1]
SHARED_SQUAD = ROOT.parent / "shared" / "data" / "squad"
SHARED_ORACLES = ROOT.parent / "shared" / "oracles"
PYTHON = sys.executable


def sample_path(name):
    """A file of the shipped sample (tools/make_sample.py generates it)."""
    return ROOT / "bert_squad" / "sample" / name

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# --- tiers ---------------------------------------------------------------------------------------------
# The markers are declared in setup.cfg (--strict-markers). A run that must run everything (CI, which runs
# .ci/run with CI=true, or BERT_SQUAD_REQUIRE_ALL=1) turns every skip into a failure that names its reason,
# except in the tiers that depend on the machine's hardware rather than on its set-up: `gpu` on a CPU host,
# `cpu` on a GPU host. Root, the Debian packages and ../shared are set-up: `make test` as root provides them.
HARDWARE_TIERS = ("gpu", "cpu")


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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@functools.lru_cache(maxsize=None)
def gpu_count():
    """CUDA or ROCm devices torch sees here (ROCm builds answer through torch.cuda too)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_runtest_setup(item):
    """Skip, with the reason, what this machine cannot run: the hardware tiers, and mpirun where it is missing."""
    if item.get_closest_marker("gpu") and not gpu_count():
        pytest.skip("needs a CUDA or ROCm GPU: torch sees none on this host")
    if item.get_closest_marker("cpu") and gpu_count():
        pytest.skip(f"assumes a CPU-only host (fp16 refused, gloo, device cpu); torch sees {gpu_count()} GPU(s) "
                    "here: the gpu tier covers this host")
    if item.get_closest_marker("mpi") and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (make test installs Open MPI from Debian when run as root)")
    if item.get_closest_marker("mpi") and gpu_count() == 1:
        pytest.skip("two ranks on one host need its CPU or two GPUs (NCCL takes a GPU per rank); this host has 1")


def pytest_collection_modifyitems(items):
    """The clusters' own tests (test_fixtures.py) first: they start and break clusters of their own, which
    they cannot while this session's shared one (a session fixture) is up."""
    items.sort(key=lambda item: item.path.name != "test_fixtures.py")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a run that must run everything, a skip outside the hardware tiers is a failure naming its reason."""
    report = (yield).get_result()
    if not (report.skipped and item.config.stash[_REQUIRE_ALL]) or hasattr(report, "wasxfail"):
        return
    tiers = {m.name for m in item.iter_markers()} & item.config.stash[_TIERS]
    if tiers & set(HARDWARE_TIERS):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped in a run that must run every tier (CI or BERT_SQUAD_REQUIRE_ALL=1; tiers of this "
                       f"test: {', '.join(sorted(tiers)) or 'none'}): {reason}")


def shared_squad(name):
    """A file of ../shared/data/squad, or skip (tests that call it are in the `oracle` tier)."""
    path = SHARED_SQUAD / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real SQuAD data lives in ../shared beside the clone)")
    return path


def shared_oracle(version):
    """The official SQuAD evaluation script `evaluate-v<version>.py` ("1.1" or "2.0"), or skip.

    They live in ../shared/oracles beside the clone (CI has it) and are never copied into the repo; tests
    that call this are in the `oracle` tier.
    """
    path = SHARED_ORACLES / f"evaluate-v{version}.py"
    if not path.exists():
        pytest.skip(f"{path} is absent: the official SQuAD evaluation scripts (test oracles) live in "
                    "../shared/oracles beside the clone")
    return path


_OFFICIAL_MODULES = {}


def official_module(version):
    """The official script for `version` loaded as a module (its per-answer functions, or skip)."""
    if version not in _OFFICIAL_MODULES:
        import importlib.util

        path = shared_oracle(version)
        spec = importlib.util.spec_from_file_location(f"official_squad_v{version.replace('.', '_')}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _OFFICIAL_MODULES[version] = module
    return _OFFICIAL_MODULES[version]


def run_official(version, data_file, pred_file, na_prob_file=None, na_prob_thresh=None):
    """Run `python evaluate-v<version>.py DATA PRED [-n NA] [-t T]` (or skip); its stdout JSON, parsed.

    Keys keep the script's order, so `json.dumps` of the result is the line `bert-squad score` must print.
    """
    cmd = [PYTHON, str(shared_oracle(version)), str(data_file), str(pred_file)]
    if na_prob_file is not None:
        cmd += ["--na-prob-file", str(na_prob_file)]
    if na_prob_thresh is not None:
        cmd.append(f"--na-prob-thresh={float(na_prob_thresh)!r}")  # "=": a negative value is no option
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    return json.loads(done.stdout)


def random_predictions(squad, seed):
    """Answers a model might give on real data: references, context slices, "", confidences."""
    rng = random.Random(seed)
    preds, na = {}, {}
    for article in squad["data"]:
        for para in article["paragraphs"]:
            ctx = para["context"]
            for q in para["qas"]:
                r = rng.random()
                if r < 0.3 and q["answers"]:
                    preds[q["id"]] = rng.choice(q["answers"])["text"]
                elif r < 0.45:
                    preds[q["id"]] = ""
                else:
                    i = rng.randrange(len(ctx))
                    preds[q["id"]] = ctx[i:i + rng.randrange(1, 60)]
                na[q["id"]] = round(rng.random(), 2)  # rounded: ties, as real confidences have
    return preds, na


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
def tiny_model(tmp_path_factory):
    """A randomly initialised 2-layer BERT whose WordPiece vocabulary is trained on the sample: it loads
    offline and trains in seconds (tests/tiny_models.py builds the other families the same way)."""
    from tiny_models import build_tiny_model

    return build_tiny_model("bert", tmp_path_factory.mktemp("tiny-bert"))


def decode_spans(examples, tokenizer, win, features):
    """Character spans of the labelled tokens, recomputed from the tokenizer's offsets."""
    from bert_squad.features import _tokenize

    batch = {"question": [r["question"] for r in examples.records],
             "context": [r["context"] for r in examples.records]}
    enc = _tokenize(batch, tokenizer, win)
    assert len(enc["input_ids"]) == len(features)
    spans = []
    for i, feat in enumerate(features):
        s, e = feat["start_positions"], feat["end_positions"]
        ex = examples.records[enc["overflow_to_sample_mapping"][i]]
        assert feat["example_index"] == enc["overflow_to_sample_mapping"][i]
        if s:
            assert enc.sequence_ids(i)[s] == 1 and enc.sequence_ids(i)[e] == 1
            spans.append((ex, ex["context"][enc["offset_mapping"][i][s][0]:enc["offset_mapping"][i][e][1]]))
    return spans


def ds_config(tmp_path, shipped, drop=(), **sections):
    """A shipped DeepSpeed config with `drop`ped and replaced top-level sections, written into `tmp_path`."""
    cfg = json.loads((ROOT / "configs" / f"{shipped}.json").read_text())
    for key in drop:
        cfg.pop(key)
    cfg.update(sections)
    path = tmp_path / f"{shipped}-{'-'.join([*drop, *sections]) or 'as-shipped'}.json"
    path.write_text(json.dumps(cfg))
    return path


def zero_on_cpu(tmp_path, stage, bf16=False):
    """ds_zero2 or ds_zero3 as shipped, its fp16 (which needs a GPU) swapped for fp32 or bf16: ZeRO on the
    CPU. ZeRO-3 partitions every parameter (threshold 0), even the tiny model's smallest ones."""
    sections = {"bf16": {"enabled": True}} if bf16 else {}
    if stage == 3:
        zero = json.loads((ROOT / "configs" / "ds_zero3.json").read_text())["zero_optimization"]
        sections["zero_optimization"] = dict(zero, stage3_param_persistence_threshold=0)
    return ds_config(tmp_path, f"ds_zero{stage}", drop=["fp16"], **sections)


# --- processes ------------------------------------------------------------------------------------------

class Started:
    """A process a test starts: its own process group, stdout and stderr in files (nothing to block on),
    and the whole group killed on the way out of the `with`, whatever happened inside it."""

    def __init__(self, cmd, folder, env=None, cwd=ROOT):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.cmd, self.stdout_file, self.stderr_file = list(map(str, cmd)), folder / "stdout", folder / "stderr"
        with open(self.stdout_file, "wb") as out, open(self.stderr_file, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                         start_new_session=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    @property
    def stdout(self):
        return self.stdout_file.read_text(errors="replace")

    @property
    def stderr(self):
        return self.stderr_file.read_text(errors="replace")

    def seen(self):
        return f"{' '.join(self.cmd)}\n--- stdout:\n{self.stdout[-3000:]}\n--- stderr:\n{self.stderr[-3000:]}"

    def wait_for(self, pattern, timeout=300):
        """Until stdout matches `pattern` (a regex); fails with the output when the process ends first or
        the deadline passes. Returns the match."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.stdout)):
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before printing {pattern!r}: {self.seen()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not printed within {timeout}s: {self.seen()}")
            time.sleep(0.1)
        return found

    def wait(self, timeout):
        """The exit code; fails with the output if the process is still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s: {self.seen()}") from None

    def kill(self):
        """SIGKILL to the whole group (a launcher's ranks too), then reap the leader."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


def run_bert_squad(*args, launcher=(), env=None, timeout=600, cwd=ROOT):
    """Run the real CLI (optionally under a launcher such as mpirun) to its end; its group is killed after."""
    import tempfile

    env = {**launcher_env(launcher), **(env or {})}
    with tempfile.TemporaryDirectory(prefix="bert-squad-run-") as folder, \
            Started([*launcher, PYTHON, "-m", "bert_squad", *args], folder, env=env, cwd=cwd) as proc:
        code = proc.wait(timeout)
        return subprocess.CompletedProcess(proc.cmd, code, proc.stdout, proc.stderr)


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def launcher_env(launcher):
    """mpirun's ranks on one host meet at MASTER_PORT, by default a fixed port that test sessions running
    side by side on a shared machine would collide on: a free one instead."""
    return {"MASTER_PORT": str(free_port())} if launcher else {}


# A real single-node Slurm (session fixture `slurm_cluster`), shared by the launch and sweep tests, and a
# real multi-node one of network namespaces on this machine (`multinode_cluster`, tests/test_multinode.py).
from slurm_cluster import free_port, multinode_cluster, slurm_cluster  # noqa: E402,F401


def put_in_hub_cache(hub_cache, repo_id, model_dir, revision="0" * 40):
    """`model_dir`'s files as hub model `repo_id` in a Hugging Face hub cache, in the documented layout
    (refs/main names the snapshot; files are blobs linked from it), as `snapshot_download` leaves it."""
    import hashlib

    repo = Path(hub_cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
