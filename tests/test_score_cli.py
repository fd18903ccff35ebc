"""`bert-squad score` prints what the official SQuAD scripts print, and names the file at fault.

The expected line is what `evaluate-v1.1.py` / `evaluate-v2.0.py` (../shared/oracles, run as programs
on the same files) print, re-serialised compactly: same keys, same order, same floats. Those tests
skip where ../shared/oracles is absent.
"""

import json
import subprocess

import pytest

from bert_squad.errors import UserError
from bert_squad import score
from helpers import PYTHON, ROOT, random_predictions, run_official, sample_path, shared_squad


def run_score(*args):
    return subprocess.run([PYTHON, "-m", "bert_squad", "score", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def assert_same_as_official(tmp_path, eval_file, version, na_thresh=None, seed=0):
    """Random predictions (and no-answer probabilities for v2.0) scored both ways: same JSON line."""
    squad = json.loads(eval_file.read_text())
    preds, na = random_predictions(squad, seed)
    pred_file = write(tmp_path / "pred.json", preds)
    ours_args = ["--eval-file", eval_file, "--predictions", pred_file]
    if version == "v2_0":
        na_file = write(tmp_path / "na.json", na)
        ours_args += ["--na-probs", na_file]
        if na_thresh is not None:
            ours_args += ["--na-prob-thresh", na_thresh]
        theirs = run_official("2.0", eval_file, pred_file, na_file, na_thresh)
    else:
        theirs = run_official("1.1", eval_file, pred_file)
    ours = run_score(*ours_args)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.splitlines()[-1] == json.dumps(theirs)
    return theirs


@pytest.mark.parametrize("name, version, thresh", [
    ("dev-v1.1.json", "v1_1", None), ("dev-v2.0.json", "v2_0", None), ("dev-v2.0.json", "v2_0", 0.4)])
@pytest.mark.oracle
def test_sample_scores_equal_official(tmp_path, name, version, thresh):
    theirs = assert_same_as_official(tmp_path, sample_path(name), version, thresh)
    assert ("best_f1" in theirs) == (version == "v2_0")


@pytest.mark.parametrize("name, version", [("dev-v1.1-subset.json", "v1_1"),
                                           ("dev-v2.0-subset.json", "v2_0")])
@pytest.mark.oracle
def test_real_dev_scores_equal_official(tmp_path, name, version):
    assert_same_as_official(tmp_path, shared_squad(name), version, seed=3)


@pytest.mark.oracle
def test_v1_missing_prediction_scores_zero_with_a_message(tmp_path, capsys):
    eval_file = sample_path("dev-v1.1.json")
    preds, _ = random_predictions(json.loads(eval_file.read_text()), seed=4)
    missing = preds.popitem()[0]
    pred_file = write(tmp_path / "pred.json", preds)
    assert score.run(score.parse(["--eval-file", str(eval_file), "--predictions", str(pred_file),
                                  "--out-file", str(tmp_path / "eval.json")])) == 0
    out, err = capsys.readouterr()
    assert f"Unanswered question {missing} will receive score 0." in err
    assert json.loads(out.splitlines()[-1]) == json.loads((tmp_path / "eval.json").read_text())
    assert out.splitlines()[-1] == json.dumps(run_official("1.1", eval_file, pred_file))


V2 = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Paris is big.", "qas": [
    {"id": "a", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}], "is_impossible": False},
    {"id": "b", "question": "?", "answers": [], "is_impossible": True}]}]}]}


@pytest.mark.parametrize("eval_doc, preds, na, message", [
    (None, {"a": "x"}, None, "eval.json: no such file"),
    ("{not json", {"a": "x"}, None, "eval.json: malformed JSON"),
    ({"version": "v2.0"}, {"a": "x"}, None, "eval.json: expected an object with a 'data' list"),
    ({"data": [{"paragraphs": [{"context": "c"}]}]}, {}, None,
     r"eval.json: data\[0\].paragraphs\[0\] has no 'qas'"),
    ({"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]}, {}, None,
     r"eval.json: data\[0\].paragraphs\[0\].qas\[0\] has no string 'id'"),
    ({"data": [{"paragraphs": [{"qas": [{"id": "a"}]}]}]}, {}, None, "eval.json: question a .*'answers'"),
    ({"data": []}, {}, None, "eval.json: no questions"),
    ({"version": "1.1", "data": [{"paragraphs": [{"qas": [{"id": "a", "answers": []}]}]}]}, {"a": "x"}, None,
     "eval.json: question a has no answers"),
    (V2, ["a"], None, "pred.json: expected an object mapping question id to an answer string"),
    (V2, {"a": "x", "b": 3}, None, "pred.json: question b: expected an answer string, got 3"),
    (V2, {"a": "x"}, None, "pred.json: no prediction for 1 of 2 questions: b"),
    (V2, {"a": "x", "b": ""}, {"a": "high"}, "na.json: question a: expected a number"),
    (V2, {"a": "x", "b": ""}, {"a": 0.5}, "na.json: no no-answer probability for 1 of 2 questions: b"),
    ({"version": "1.1", "data": V2["data"][:0]}, {}, {"a": 0.5}, "eval.json: --na-probs .* v2.0 data only"),
])
def test_bad_input_names_the_file(tmp_path, eval_doc, preds, na, message):
    eval_file, pred_file, na_file = tmp_path / "eval.json", tmp_path / "pred.json", tmp_path / "na.json"
    if eval_doc is not None:
        eval_file.write_text(eval_doc if isinstance(eval_doc, str) else json.dumps(eval_doc))
    write(pred_file, preds)
    args = ["--eval-file", str(eval_file), "--predictions", str(pred_file)]
    if na is not None:
        args += ["--na-probs", str(write(na_file, na))]
    with pytest.raises(UserError, match=message):
        score.run(score.parse(args))


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "none.json"
    done = run_score("--eval-file", write(tmp_path / "eval.json", V2), "--predictions", missing)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"bert-squad score: error: {missing}: no such file"]
    assert done.stdout == ""


@pytest.mark.parametrize("target, reason", [(lambda d: d, "Is a directory"),
                                            (lambda d: d / "no" / "eval.json", "No such file or directory")],
                         ids=["directory", "no-parent"])
def test_an_out_file_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, target, reason):
    """Found by tests/test_cli_fuzz.py: `--out-file DIR` was an IsADirectoryError and left a temp file."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    preds = write(tmp_path / "pred.json", {"a": "Paris", "b": ""})
    out = target(out_dir)
    done = run_score("--eval-file", write(tmp_path / "eval.json", V2), "--predictions", preds, "--out-file", out)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"bert-squad score: error: {out}: cannot be written ({reason})"]
    assert list(out_dir.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "eval.json", "out", "pred.json"]
