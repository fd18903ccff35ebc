"""Which history a resumed run continues: the checkpoint's, or the finished run's train_metrics.json where that run
ended at the checkpoint's step (its evaluation after the checkpoint is there only). The whole-run behaviour, logs and
parts across stops and world sizes, is in test_resume.py and test_resume_anywhere.py."""

import json

import pytest

from bert_squad.history import History, Part


def checkpoint(tmp_path, last_step: int) -> History:
    saved = History([{"step": 2, "loss": 1.0}], [], [Part(0, last_step, 1, 5.0)])
    (tmp_path / "ckpt").mkdir()
    saved.save(tmp_path / "ckpt")
    return saved


def finished_metrics(last_step: int) -> dict:
    done = History([{"step": 2, "loss": 1.0}], [{"step": 4, "f1": 50.0}], [Part(0, last_step, 1, 7.0)])
    return {"exact_match": 40.0, **done.as_dict(), "wall_time_s": done.wall_time_s}


def test_a_run_finished_at_the_checkpoint_continues_its_metrics(tmp_path):
    checkpoint(tmp_path, 4)
    (tmp_path / "train_metrics.json").write_text(json.dumps(finished_metrics(4)))
    resumed = History.resumed(tmp_path / "ckpt", tmp_path / "train_metrics.json")
    assert resumed.evals == [{"step": 4, "f1": 50.0}] and resumed.wall_time_s == 7.0


def test_metrics_of_another_step_leave_the_checkpoints_history(tmp_path):
    saved = checkpoint(tmp_path, 2)
    (tmp_path / "train_metrics.json").write_text(json.dumps(finished_metrics(4)))
    assert History.resumed(tmp_path / "ckpt", tmp_path / "train_metrics.json") == saved


@pytest.mark.parametrize("damaged", ['{"logs": [', "[]", '{"logs": [], "evals": []}', '{"logs": 1, "parts": [{}]}'])
def test_damaged_metrics_leave_the_checkpoints_history(tmp_path, damaged):
    """A train_metrics.json cut short or edited since is no reason to stop a resume: the checkpoint's history is
    whole to its step."""
    saved = checkpoint(tmp_path, 4)
    (tmp_path / "train_metrics.json").write_text(damaged)
    assert History.resumed(tmp_path / "ckpt", tmp_path / "train_metrics.json") == saved
