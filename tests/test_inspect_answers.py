"""`bert-squad-test` run as users run it: the questions asked for, scored as `metrics` scores them,
and one-line errors for a range or a model that cannot work."""

import json
import os
from pathlib import Path

import pytest
from helpers import PYTHON, run_in_checkout, sample_path

from bert_squad import metrics
from bert_squad.inspect_answers import predicted_offsets

SCRIPT = Path(PYTHON).parent / "bert-squad-test"


def run_show(*args):
    """The installed console script (or the same entry point where the venv has none)."""
    cmd = (
        [str(SCRIPT)]
        if SCRIPT.exists()
        else [PYTHON, "-c", "from bert_squad.cli import bert_squad_test; raise SystemExit(bert_squad_test())"]
    )
    return run_in_checkout(*cmd, *args, timeout=300, env=dict(os.environ, COLUMNS="300"))  # rich wraps at 80 otherwise


def questions(eval_file):
    """(id, question, context, answer texts) in file order."""
    doc = json.loads(Path(eval_file).read_text())
    return [
        (qa["id"], qa["question"], para["context"], [a["text"] for a in qa["answers"]])
        for article in doc["data"]
        for para in article["paragraphs"]
        for qa in para["qas"]
    ]


def window_args(model, eval_file, start, count):
    return [
        "--model-file",
        model,
        "--eval-file",
        eval_file,
        "--start-sample",
        start,
        "--num-test-samples",
        count,
        "--max-seq-length",
        128,
        "--doc-stride",
        48,
    ]


@pytest.mark.parametrize("dev, start, count", [("sample_dev", 5, 3), ("sample_dev_v2", 26, 3)])
def test_json_lists_the_chosen_questions_with_their_scores(request, tiny_model, dev, start, count):
    eval_file = request.getfixturevalue(dev)
    done = run_show(*window_args(tiny_model, eval_file, start, count), "--json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    expected = questions(eval_file)[start : start + count]
    assert [r["id"] for r in results] == [qid for qid, *_ in expected]
    for r, (_, question, context, answers) in zip(results, expected):
        assert (r["question"], r["answers"]) == (question, answers)
        pred = r["prediction"]
        assert r["exact_match"] == 100 * metrics.exact_match(pred, answers)
        assert r["f1"] == 100 * metrics.f1(pred, answers)
        # The highlight is the predicted span itself (None for "no answer").
        assert (context[slice(*r["prediction_offsets"])] if pred else r["prediction_offsets"]) == (pred or None)
    if dev == "sample_dev_v2":
        assert [] in [r["answers"] for r in results]  # an unanswerable question is among them


def test_a_range_past_the_files_end_shows_up_to_its_last_question(tiny_model, sample_dev):
    """5 questions from the second to last: the last two, as a slice takes them, and a line says so."""
    done = run_show(*window_args(tiny_model, sample_dev, DEV_QUESTIONS - 2, 5), "--json")
    assert done.returncode == 0, done.stderr
    assert [r["index"] for r in json.loads(done.stdout)] == [DEV_QUESTIONS - 2, DEV_QUESTIONS - 1]
    assert f"questions {DEV_QUESTIONS - 2}..{DEV_QUESTIONS - 1}, its last" in done.stderr


def test_rich_view_shows_questions_references_and_a_summary(tiny_model, sample_dev):
    done = run_show(*window_args(tiny_model, sample_dev, 0, 2))
    assert done.returncode == 0, done.stderr
    for _, question, _, answers in questions(sample_dev)[:2]:
        assert question in done.stdout
        assert " | ".join(answers) in done.stdout
    assert "bert-squad-test" in done.stdout and "mean" in done.stdout  # the summary table


def test_highlight_is_the_predicted_span_not_the_nbest_head():
    nbest = [{"text": "", "offsets": None}, {"text": "dog", "offsets": [10, 13]}, {"text": "dog", "offsets": [0, 3]}]
    assert predicted_offsets("dog", nbest) == [10, 13]
    assert predicted_offsets("", nbest) is None


def encoder_dir(tmp_path, tiny_model):
    """The tiny model's config, declared as a bare encoder (no span head to answer with)."""
    config = json.loads((tiny_model / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, architectures=["BertModel"])))
    return tmp_path


DEV_QUESTIONS = sum(
    len(p["qas"]) for a in json.loads(sample_path("dev-v1.1.json").read_text())["data"] for p in a["paragraphs"]
)


@pytest.mark.parametrize(
    "model, start, message",
    [
        (
            lambda tmp, tiny: tiny,
            100000,
            f"--start-sample 100000 is outside its {DEV_QUESTIONS} questions (questions 0..{DEV_QUESTIONS - 1})",
        ),
        (
            lambda tmp, tiny: tiny,
            DEV_QUESTIONS,
            f"--start-sample {DEV_QUESTIONS} is outside its {DEV_QUESTIONS} questions",
        ),
        (encoder_dir, 0, "not a question-answering model (architectures: BertModel)"),
        (lambda tmp, tiny: tmp, 0, "not a model directory (no config.json)"),
    ],
    ids=["range", "range-end", "encoder", "no-config"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, tiny_model, sample_dev, model, start, message):
    done = run_show(*window_args(model(tmp_path, tiny_model), sample_dev, start, 2))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("bert-squad-test: error: ") and message in line
