"""Shared fixtures: the shipped sample data and a tiny BERT built offline from it."""

import os
import sys
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


def shared_squad(name):
    """A file of ../shared/data/squad, or skip: CI and users may not have it."""
    path = SHARED_SQUAD / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real SQuAD data lives in ../shared beside the clone)")
    return path


def shared_oracle(version):
    """The official SQuAD evaluation script `evaluate-v<version>.py` ("1.1" or "2.0"), or skip.

    They live in ../shared/oracles beside the clone (CI has it) and are never copied into the repo.
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
    import json
    import subprocess

    cmd = [PYTHON, str(shared_oracle(version)), str(data_file), str(pred_file)]
    if na_prob_file is not None:
        cmd += ["--na-prob-file", str(na_prob_file)]
    if na_prob_thresh is not None:
        cmd.append(f"--na-prob-thresh={float(na_prob_thresh)!r}")  # "=": a negative value is no option
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    return json.loads(done.stdout)


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


def run_bert_squad(*args, launcher=(), env=None, timeout=600, cwd=ROOT):
    """Run the real CLI in a subprocess (optionally under a launcher such as mpirun)."""
    import subprocess

    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [*launcher, PYTHON, "-m", "bert_squad", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd)


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def require_mpirun():
    import shutil

    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (make test installs Open MPI from Debian when run as root)")


# A real single-node Slurm (session fixture `slurm_cluster`), shared by the launch and sweep tests, and a
# real multi-node one of network namespaces on this machine (`multinode_cluster`, tests/test_multinode.py).
from slurm_cluster import multinode_cluster, slurm_cluster  # noqa: E402,F401


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
