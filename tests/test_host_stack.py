"""A GPU host's own stack: the container's Python with the libraries it lacks in a folder on PYTHONPATH (the
kit of bench/gpu_kit.py, a site's module of wheels). dill, which datasets fingerprints tables with, pickles by
value every module imported from outside the interpreter's prefix; with pyarrow in such a folder, hashing a
new in-memory table reaches pyarrow's MonthDayNano type and raises PicklingError. The project gives each of
its datasets a fingerprint of its own, so every command runs there all the same.

The folder here holds the venv's own pyarrow, linked (or copied) to a temporary directory, first on
PYTHONPATH: the same pyarrow, imported from outside the prefix, as on that host.
"""

import os
import shutil
import subprocess

import pytest
from helpers import PYTHON, inference_args, run_bert_squad, train_args

HOST_ERROR = "PicklingError: Can't pickle <class 'MonthDayNano'>"


@pytest.fixture(scope="module")
def outside_prefix(tmp_path_factory):
    """The environment of a process that imports pyarrow from a folder outside its interpreter's prefix."""
    import pyarrow

    folder = tmp_path_factory.mktemp("site")
    try:  # hard links: no copy of 170 MB, and unlike a symbolic link no way back into the prefix
        shutil.copytree(os.path.dirname(pyarrow.__file__), folder / "pyarrow", copy_function=os.link)
    except OSError:  # another file system
        shutil.rmtree(folder / "pyarrow", ignore_errors=True)
        shutil.copytree(os.path.dirname(pyarrow.__file__), folder / "pyarrow")
    return {"PYTHONPATH": str(folder)}, str(folder)


def test_datasets_own_fingerprint_fails_there(outside_prefix):
    """The host's failure, reproduced: a Dataset built the usual way hashes its table, and that raises."""
    env, folder = outside_prefix
    script = (
        "import datasets, pyarrow, sys\n"
        f"assert pyarrow.__file__.startswith({folder!r}), pyarrow.__file__\n"
        "datasets.Dataset.from_list([{'id': 'q1', 'answers': {'text': ['a'], 'answer_start': [0]}}])\n"
    )
    p = subprocess.run([PYTHON, "-c", script], env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and HOST_ERROR in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_every_command_runs_there(outside_prefix, tiny_model, sample_train, sample_dev_v2, tmp_path):
    """train builds its features (and evaluates), a second run reads them from the cache, evaluate takes the
    cached eval features, predict builds those of its unlabelled questions, and answer builds its own in memory."""
    env, _ = outside_prefix
    out, cache = tmp_path / "run", tmp_path / "cache"
    commands = {
        "train": train_args(tiny_model, sample_train, out, "--eval-file", sample_dev_v2, "--max-steps", 2, cache=cache),
        "train again": train_args(
            tiny_model, sample_train, tmp_path / "again", "--max-steps", 1, "--no-eval", cache=cache
        ),
        "evaluate": inference_args("evaluate", out, sample_dev_v2, tmp_path / "evaluate", cache=cache),
        "predict": inference_args("predict", out, sample_dev_v2, tmp_path / "predict", cache=cache),
        "answer": ["answer", "--model-dir", out, "--question", "Who wrote it?", "--context", "Ada wrote it.", "--json"],
    }
    built = {}
    for name, args in commands.items():
        r = run_bert_squad(*args, env=env)
        assert r.returncode == 0 and HOST_ERROR not in r.stderr, f"{name}: {r.stderr[-2000:]}"
        built[name] = sorted(p.name.split("-")[0] for p in (cache / "features").glob("*.arrow"))
    # Each set of features was built once and found again: train's two, then predict's unlabelled questions.
    assert built["train"] == built["train again"] == built["evaluate"] == ["eval", "train"]
    assert built["predict"] == built["answer"] == ["eval", "eval", "train"]
    predictions = [(tmp_path / name / "predictions.json").read_text() for name in ("evaluate", "predict")]
    assert predictions[0] == predictions[1]
