"""Every file and folder a command writes has the mode the umask gives it (0644 / 0755 under 022, 0640 / 0750
under 027), the weights too, which safetensors writes owner-only and the export moves into place: on a project's
shared scratch, teammates load what a run wrote. Each writer runs under the umask a user's shell would set."""

import json
import os
import stat

import pytest
from helpers import inference_args, run_bert_squad, train_args
from test_evaluate import without_answers

from bert_squad import cli
from bert_squad.checkpoint import checkpoint_root

pytestmark = pytest.mark.slow


def modes(root):
    """Each path under `root`, itself included, with its permission bits: {path: mode}."""
    found = {}
    for folder, _, files in os.walk(root):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            found[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def assert_umask_modes(root, umask):
    expected = {True: 0o777 & ~umask, False: 0o666 & ~umask}
    wrong = {p: oct(m) for p, m in modes(root).items() if m != expected[os.path.isdir(p)]}
    assert not wrong, wrong
    assert len(modes(root)) > 1  # something was written


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_training_export_evaluate_and_predict_write_the_umasks_modes(
    umask, tiny_model, sample_train, sample_dev, tmp_path
):
    def run(*args):
        r = run_bert_squad(*map(str, args), umask=umask)
        assert r.returncode == 0, r.stderr[-3000:]

    out, cache = tmp_path / "run", tmp_path / "cache"
    run(*train_args(tiny_model, sample_train, out, "--max-steps", 2, "--checkpoint-every", 2, cache=cache))
    assert (out / "model.safetensors").is_file() and (checkpoint_root(out) / "step00000002").is_dir()
    run("export", "--checkpoint", checkpoint_root(out), "--output-dir", tmp_path / "exported")
    run(*inference_args("evaluate", out, sample_dev, tmp_path / "eval", cache=cache))
    unlabelled = without_answers(sample_dev, tmp_path / "unlabelled.json")
    run(*inference_args("predict", out, unlabelled, tmp_path / "predict", cache=cache))
    for written in ("run", "exported", "eval", "predict"):
        assert_umask_modes(tmp_path / written, umask)


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_a_sweeps_summary_has_the_umasks_modes(umask, tmp_path):
    from test_sweep import fake_sweep

    sweep_dir = tmp_path / "sweep"
    fake_sweep(sweep_dir)
    for path in modes(sweep_dir):  # the fake sweep's own files, as a sweep's runs would have written them
        os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)
    before = os.umask(umask)
    try:
        assert cli.main(["summarize", str(sweep_dir)]) == 0
    finally:
        os.umask(before)
    assert {"summary.csv", "summary.md", "f1_by_combination.png"} <= {p.name for p in sweep_dir.iterdir()}
    assert_umask_modes(sweep_dir, umask)
    assert json.loads((sweep_dir / "sweep.json").read_text())["name"] == "lr"
