"""A model carries how it was trained: its export records its windows and answer rules (bert_squad_task.json),
and `evaluate`, `predict`, `answer`, `bert-squad-test` and the `Answerer` API answer with them unless told
otherwise, saying which values came from where. The oracle is the training run's own evaluation: the same
model with the same settings gives the same predictions, byte for byte."""

import json
import shutil

import pytest
from helpers import run_bert_squad, train_args, window_args
from test_evaluate import without_answers

from bert_squad import task
from bert_squad.config import PostprocessConfig, WindowConfig
from bert_squad.errors import UserError
from bert_squad.task import TASK_FILE

pytestmark = pytest.mark.slow

# Not the CLI's defaults (384/128, questions up to 64 tokens), nor any the defaults derive: a command that fell
# back to them would cut other windows, and answer otherwise.
WINDOWS = window_args(96, 24, 20)
ANSWERS = ["--max-answer-length", "6", "--n-best-size", "7"]


@pytest.fixture(scope="module")
def trained(tiny_model, sample_train, sample_dev, tmp_path_factory):
    """A tiny run with non-default windows and answer rules, evaluated on the dev sample, checkpointed."""
    out = tmp_path_factory.mktemp("trained") / "run"
    steps = ["--max-steps", "3", "--checkpoint-every", "3", "--eval-file", sample_dev, *ANSWERS]
    r = run_bert_squad(*train_args(tiny_model, sample_train, out, *steps, cache=out.parent / "cache", windows=WINDOWS))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def run_ok(*args):
    r = run_bert_squad(*map(str, args))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_export_and_a_checkpoints_export_record_the_training(trained, tmp_path):
    run = json.loads((trained / "train_metrics.json").read_text())["config"]
    recorded = json.loads((trained / TASK_FILE).read_text())
    assert recorded["windows"] == run["windows"] == {"max_seq_length": 96, "doc_stride": 24, "max_query_length": 20}
    assert recorded["answers"] == run["postprocess"] and recorded["answers"]["n_best_size"] == 7
    assert recorded["version_2_with_negative"] is False  # the v1.1 sample
    run_ok("export", "--checkpoint", trained / "checkpoints", "--output-dir", tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / TASK_FILE).read_text()) == recorded


def test_an_export_leaves_no_task_file_of_other_weights(trained, tmp_path):
    """A checkpoint of an older bert-squad records no task (its hf/ has no bert_squad_task.json): exported into a
    folder that holds an older export's task file, that file goes, since it describes other weights."""
    older = tmp_path / "older"
    shutil.copytree(trained / "checkpoints" / "step00000003", older)
    (older / "hf" / TASK_FILE).unlink()
    marker = json.loads((older / "complete").read_text())
    del marker["files"][f"hf/{TASK_FILE}"]
    (older / "complete").write_text(json.dumps(marker))
    out = tmp_path / "exported"
    out.mkdir()
    (out / TASK_FILE).write_text((trained / TASK_FILE).read_text().replace("96", "384"))
    run_ok("export", "--checkpoint", older, "--output-dir", out)
    assert (out / "model.safetensors").is_file() and not (out / TASK_FILE).exists()


def test_evaluate_and_predict_answer_as_the_run_did(trained, sample_dev, tmp_path):
    r = run_ok("evaluate", "--model-dir", trained, "--eval-file", sample_dev, "--output-dir", tmp_path / "eval")
    for name in ("predictions.json", "nbest_predictions.json"):
        assert (tmp_path / "eval" / name).read_bytes() == (trained / name).read_bytes(), name
    assert json.loads(r.stdout.splitlines()[-1]) == {
        k: v for k, v in json.loads((trained / "eval_metrics.json").read_text()).items() if k in ("exact_match", "f1")
    }
    assert "windows 96/24, questions up to 20 tokens (as trained)" in r.stderr
    assert "answers up to 6 tokens, n-best 7, null threshold 0 (as trained)" in r.stderr
    unlabelled = without_answers(sample_dev, tmp_path / "unlabelled.json")
    r = run_ok("predict", "--model-dir", trained, "--input", unlabelled, "--output-dir", tmp_path / "pred")
    assert (tmp_path / "pred" / "predictions.json").read_bytes() == (trained / "predictions.json").read_bytes()
    # no answer option was typed: none is "given"
    assert "answers up to 6 tokens, n-best 7, null threshold 0 (as trained)" in r.stderr and "(given" not in r.stderr


def test_a_v1_model_answers_a_v2_file_alike_in_every_command(trained, sample_dev_v2, tmp_path):
    """One rule for "no answer": the model's record. A model trained on v1.1 answers a labelled v2.0 file with
    a span for every question in evaluate, predict and bert-squad-test alike (the file's version is only
    checked, and said), and none of them writes null odds."""
    r = run_ok("evaluate", "--model-dir", trained, "--eval-file", sample_dev_v2, "--output-dir", tmp_path / "eval")
    assert 'no "no answer" (trained on SQuAD v1.1: the file\'s unanswerable questions are answered' in r.stderr
    assert "NoAns_total" in json.loads(r.stdout.splitlines()[-1])  # scored as the v2.0 file it is
    run_ok("predict", "--model-dir", trained, "--input", sample_dev_v2, "--output-dir", tmp_path / "pred")
    evaluated = (tmp_path / "eval" / "predictions.json").read_bytes()
    assert (tmp_path / "pred" / "predictions.json").read_bytes() == evaluated
    assert not (tmp_path / "eval" / "null_odds.json").exists() and not (tmp_path / "pred" / "null_odds.json").exists()
    shown = run_ok("test", "--model-dir", trained, "--eval-file", sample_dev_v2, "--num-test-samples", 40, "--json")
    assert {q["id"]: q["prediction"] for q in json.loads(shown.stdout)}.items() <= json.loads(evaluated).items()


def test_a_v2_model_exported_before_the_task_record_keeps_its_no_answer_mode(trained, sample_dev, tmp_path):
    """An export written before bert_squad_task.json kept its v2.0 mode in config.json: read as the record, so
    "no answer" competes on any file, in evaluate and predict alike."""
    older = tmp_path / "older"
    shutil.copytree(trained, older, ignore=shutil.ignore_patterns("checkpoints", TASK_FILE))
    model_config = json.loads((older / "config.json").read_text())
    (older / "config.json").write_text(json.dumps(dict(model_config, version_2_with_negative=True)))
    r = run_ok("evaluate", "--model-dir", older, "--eval-file", sample_dev, "--output-dir", tmp_path / "eval")
    assert '"no answer" competes (trained on SQuAD v2.0)' in r.stderr
    run_ok("predict", "--model-dir", older, "--input", sample_dev, "--output-dir", tmp_path / "pred")
    for name in ("predictions.json", "null_odds.json"):
        assert (tmp_path / "pred" / name).read_bytes() == (tmp_path / "eval" / name).read_bytes(), name


def test_an_option_given_wins_and_the_plan_line_says_so(trained, sample_dev, tmp_path):
    r = run_ok(
        "evaluate", "--model-dir", trained, "--eval-file", sample_dev, "--output-dir", tmp_path, "--max-seq-length", 128
    )
    # the stride follows the given window (its default: half the room the window leaves the context,
    # (128 - 20 - 3) // 2), not the trained one
    assert "windows 128/52, questions up to 20 tokens (given; trained on 96/24, questions up to 20 tokens)" in r.stderr
    assert "(as trained)" in r.stderr  # the answer rules: none given


def test_answer_the_api_and_bert_squad_test_give_the_runs_answers(trained, sample_dev, tmp_path):
    from bert_squad.answer import Answerer
    from bert_squad.data import read_squad

    run = json.loads((trained / "predictions.json").read_text())
    examples = read_squad(sample_dev)
    qa = Answerer.from_pretrained(trained)
    assert (qa.windows.max_seq_length, qa.postprocess.n_best_size) == (96, 7)
    assert qa.predict(examples)[0] == run
    asked = examples.records[:12]
    lines = [json.dumps({"id": r["id"], "question": r["question"], "context": r["context"]}) for r in asked]
    (tmp_path / "q.jsonl").write_text("\n".join(lines) + "\n")
    r = run_ok("answer", "--model-dir", trained, "--input", tmp_path / "q.jsonl", "--json")
    answered = {a["id"]: a["answers"][0]["text"] for a in map(json.loads, r.stdout.splitlines())}
    assert answered == {r["id"]: run[r["id"]] for r in asked}
    assert "(as trained)" in r.stderr
    r = run_bert_squad("test", "--model-dir", trained, "--eval-file", sample_dev, "--num-test-samples", 12, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert {q["id"]: q["prediction"] for q in json.loads(r.stdout)} == {r["id"]: run[r["id"]] for r in asked}


def test_a_model_without_the_file_gets_the_defaults_and_says_so(trained, sample_dev, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(trained, bare, ignore=shutil.ignore_patterns("checkpoints", TASK_FILE))
    r = run_ok("evaluate", "--model-dir", bare, "--eval-file", sample_dev, "--output-dir", tmp_path / "eval")
    assert "windows 384/128, questions up to 64 tokens (defaults)" in r.stderr
    assert f"records no settings of its training ({TASK_FILE})" in r.stderr


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{", "malformed JSON at line 1 column 2: Expecting property name enclosed in double quotes"),
        (
            '{"windows": {}, "answers": {}}',
            "not a bert-squad task file (it has windows, answers and version_2_with_negative)",
        ),
        (
            '{"windows": {"max_seq_length": 0}, "answers": {}, "version_2_with_negative": false}',
            "--max-seq-length must be positive, not 0",
        ),
    ],
)
def test_a_damaged_task_file_is_one_line_naming_it(trained, sample_dev, tmp_path, content, reason):
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken, ignore=shutil.ignore_patterns("checkpoints"))
    (broken / TASK_FILE).write_text(content)
    r = run_bert_squad("evaluate", "--model-dir", broken, "--eval-file", sample_dev, "--output-dir", tmp_path / "e")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"bert-squad evaluate: error: {broken / TASK_FILE}: {reason}"
    ]
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    "content, reason",
    [
        (
            '{"windows": {"max_seq_length": "256"}, "answers": {}, "version_2_with_negative": false}',
            'windows.max_seq_length is "256", where --max-seq-length takes an integer',
        ),
        (
            '{"windows": {}, "answers": {"null_score_diff_threshold": null}, "version_2_with_negative": false}',
            "answers.null_score_diff_threshold is null, where --null-score-diff-threshold takes a number",
        ),
        (
            '{"windows": {}, "answers": {"lang": "xx"}, "version_2_with_negative": false}',
            'answers.lang is "xx", where --lang takes one of ar, de, en, es, hi, vi, zh',
        ),
        ('{"windows": [], "answers": {}, "version_2_with_negative": false}', "windows is [], not an object"),
    ],
)
def test_a_recorded_value_is_read_as_its_option_parses_it(tmp_path, content, reason):
    """A value the option's parser would not give (a string for a number, null, a language it lacks) is one line
    naming the field, not a traceback or a silent fallback."""
    (tmp_path / TASK_FILE).write_text(content)
    with pytest.raises(UserError) as err:
        task.recorded(tmp_path)
    assert str(err.value) == f"{tmp_path / TASK_FILE}: {reason}"


def test_a_recorded_value_of_an_older_or_newer_writer(tmp_path):
    """Fields a newer writer added are not read; missing ones keep the option's default; JSON's 1 is a number."""
    (tmp_path / TASK_FILE).write_text(
        '{"windows": {"max_seq_length": 256, "later": 1}, "answers": {"null_score_diff_threshold": 1},'
        ' "version_2_with_negative": true, "later": {}}'
    )
    trained = task.recorded(tmp_path)
    assert trained == task.Task(
        WindowConfig(max_seq_length=256), PostprocessConfig(null_score_diff_threshold=1.0), True
    )
