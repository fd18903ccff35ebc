"""The best checkpoint (--keep-best) and early stopping, trained for real on CPU: the model written at the
end is the evaluated step's with the best dev F1, on two ranks under ZeRO-3 too, and a resumed run
remembers the best so far."""

import json

import pytest
from helpers import MPIRUN, inference_args, run_bert_squad, train_args, window_args, zero_on_cpu

pytestmark = [pytest.mark.slow, pytest.mark.cpu]

WINDOWS = window_args(96, 32, 24)


def train(tiny_model, sample_train, sample_dev, out, *extra, launcher=()):
    evaluated = ["--eval-file", sample_dev, "--eval-every", 1]
    args = train_args(tiny_model, sample_train, out, *evaluated, *extra, cache=out.parent / "cache", windows=WINDOWS)
    r = run_bert_squad(*args, launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads((out / "train_metrics.json").read_text())


@pytest.mark.mpi
def test_two_ranks_zero3_keep_the_best_steps_model(tiny_model, sample_train, sample_dev, tmp_path):
    """Five evaluated steps on 2 ranks under ZeRO-3 (parameters partitioned): the recorded best is the first
    step with the highest F1, and `evaluate` of the model left in --output-dir scores exactly that."""
    out = tmp_path / "out"
    steps = ["--max-steps", 5, "--learning-rate", "5e-1", "--keep-best", "--deepspeed_config", zero_on_cpu(tmp_path, 3)]
    _r, metrics = train(tiny_model, sample_train, sample_dev, out, *steps, launcher=MPIRUN)
    f1s = [(e["step"], e["f1"]) for e in metrics["evals"]]
    assert [s for s, _ in f1s] == [1, 2, 3, 4, 5]
    best_f1 = max(f for _, f in f1s)
    assert metrics["best_step"] == next(s for s, f in f1s if f == best_f1) and metrics["best_metrics"]["f1"] == best_f1
    assert metrics["best_step"] != 5, "the run must have had a better step than its last to test anything"
    assert not (out / "best").exists()
    again = run_bert_squad(
        *inference_args("evaluate", out, sample_dev, tmp_path / "eval", cache=tmp_path / "cache", windows=WINDOWS)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1]) == metrics["best_metrics"]
    assert (tmp_path / "eval" / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()


def test_early_stopping_ends_cleanly_and_a_resumed_run_remembers_the_best(
    tiny_model, sample_train, sample_dev, tmp_path
):
    """A learning rate of 1e-9 keeps every F1 equal, so the first step stays the best (a tie keeps the earlier
    step) and --early-stopping 3 ends the run after step 4, exit 0. Resumed from its step-2 checkpoint, a run
    ends there too: it remembered the best step and the evaluation since."""
    args = ["--max-steps", 20, "--learning-rate", "1e-9", "--early-stopping", 3, "--checkpoint-every", 2]
    r, metrics = train(tiny_model, sample_train, sample_dev, tmp_path / "full", *args)
    assert "early stopping at step 4: 3 evaluations without a better dev F1 than step 1's" in r.stdout
    assert metrics["steps"] == 4 and metrics["best_step"] == 1 and len(metrics["evals"]) == 4
    # the last line says whose model it saved: the best step's, not the last one's
    f1 = metrics["best_metrics"]["f1"]
    assert f"saved the model of step 1 (the best dev F1, {f1:.2f}) and its tokenizer to {tmp_path / 'full'}" in r.stdout
    resumed = tmp_path / "resumed"
    step2 = tmp_path / "full" / "checkpoints" / "step00000002"
    r, again = train(tiny_model, sample_train, sample_dev, resumed, *args, "--resume", step2)
    assert again["steps"] == 4 and again["best_step"] == 1 and again["best_metrics"] == metrics["best_metrics"]
    # its history holds the evaluations before the checkpoint too, as the full run made them
    assert [e["step"] for e in again["evals"]] == [1, 2, 3, 4] and again["evals"][:2] == metrics["evals"][:2]
    # another output dir has none of the first run's exports: it says so and keeps the final model
    assert "saved the model of step 4 (the last step's: the export of the best step 1 is gone" in r.stdout
    assert (resumed / "model.safetensors").exists()


def test_keep_best_needs_evaluations(tiny_model, sample_train, tmp_path):
    for extra, message in (
        (["--keep-best"], "--keep-best needs --eval-every N"),
        (["--early-stopping", 2], "--early-stopping needs --eval-every N"),
        (["--keep-best", "--eval-every", 2, "--no-eval"], "--keep-best and --early-stopping choose by dev F1"),
    ):
        r = run_bert_squad(
            "--model", tiny_model, "--train-file", sample_train, "--output-dir", tmp_path / "out", *extra
        )
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "out").exists()
