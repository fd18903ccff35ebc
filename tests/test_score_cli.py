"""`bert-squad score` prints what the published SQuAD scripts print, and names the file at fault.

The last stdout line is `json.dumps` of the score, keys in the script's order. It is compared with the
independent scorers of tests/oracles.py on the same files: torchmetrics for v1.1, transformers 4.x's
squad_metrics for v2.0 (marked `transformers4`: the compat environment runs those).
"""

import json
import re

import pytest
from helpers import (
    XQUAD_LANGS,
    random_predictions,
    run_bert_squad,
    sample_path,
    shared_squad,
    shared_xquad,
)
from oracles import torchmetrics_v1, transformers_v2

from bert_squad import metrics, score
from bert_squad.errors import UserError


def run_score(*args):
    return run_bert_squad("score", *args, timeout=120)


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def scored_line(*args):
    """The JSON of `bert-squad score`'s last stdout line (it must succeed)."""
    done = run_score(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def assert_v1_same_as_torchmetrics(tmp_path, eval_file, seed):
    """Random predictions scored by the CLI and by torchmetrics: the same keys, the same values (float32's)."""
    squad = json.loads(eval_file.read_text())
    preds, _ = random_predictions(squad, seed)
    ours = scored_line("--eval-file", eval_file, "--predictions", write(tmp_path / "pred.json", preds))
    assert list(ours) == ["exact_match", "f1"]
    assert ours == pytest.approx(torchmetrics_v1(squad["data"], preds), rel=1e-5)


def assert_v2_same_as_transformers(tmp_path, eval_file, na_thresh, seed):
    """Random predictions and no-answer probabilities scored by the CLI and by transformers 4.x: the same
    line, key order and every digit included."""
    squad = json.loads(eval_file.read_text())
    preds, na = random_predictions(squad, seed)
    args = [
        "--eval-file",
        eval_file,
        "--predictions",
        write(tmp_path / "pred.json", preds),
        "--na-probs",
        write(tmp_path / "na.json", na),
    ]
    if na_thresh is not None:
        args += ["--na-prob-thresh", na_thresh]
    done = run_score(*args)
    assert done.returncode == 0, done.stderr
    theirs = transformers_v2(squad["data"], preds, na, 1.0 if na_thresh is None else na_thresh)
    assert done.stdout.splitlines()[-1] == json.dumps(theirs)
    assert "best_f1" in theirs


@pytest.mark.oracle
def test_sample_v1_scores_equal_torchmetrics(tmp_path):
    assert_v1_same_as_torchmetrics(tmp_path, sample_path("dev-v1.1.json"), seed=0)


@pytest.mark.oracle
@pytest.mark.transformers4
@pytest.mark.parametrize("thresh", [None, 0.4])
def test_sample_v2_scores_equal_transformers(tmp_path, thresh):
    assert_v2_same_as_transformers(tmp_path, sample_path("dev-v2.0.json"), thresh, seed=0)


@pytest.mark.oracle
def test_real_dev_v1_scores_equal_torchmetrics(tmp_path):
    assert_v1_same_as_torchmetrics(tmp_path, shared_squad("dev-v1.1-subset.json"), seed=3)


@pytest.mark.oracle
@pytest.mark.transformers4
def test_real_dev_v2_scores_equal_transformers(tmp_path):
    assert_v2_same_as_transformers(tmp_path, shared_squad("dev-v2.0-subset.json"), None, seed=3)


@pytest.mark.oracle
def test_v1_missing_prediction_scores_zero_with_a_message(tmp_path, capsys):
    eval_file = sample_path("dev-v1.1.json")
    squad = json.loads(eval_file.read_text())
    preds, _ = random_predictions(squad, seed=4)
    missing = preds.popitem()[0]
    pred_file = write(tmp_path / "pred.json", preds)
    assert (
        score.run(
            score.parse(
                [
                    "--eval-file",
                    str(eval_file),
                    "--predictions",
                    str(pred_file),
                    "--out-file",
                    str(tmp_path / "eval.json"),
                ]
            )
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert f"Unanswered question {missing} will receive score 0." in err
    ours = json.loads(out.splitlines()[-1])
    assert ours == json.loads((tmp_path / "eval.json").read_text())
    assert ours == pytest.approx(torchmetrics_v1(squad["data"], preds), rel=1e-5)


V2 = {
    "version": "v2.0",
    "data": [
        {
            "title": "T",
            "paragraphs": [
                {
                    "context": "Paris is big.",
                    "qas": [
                        {
                            "id": "a",
                            "question": "?",
                            "answers": [{"text": "Paris", "answer_start": 0}],
                            "is_impossible": False,
                        },
                        {"id": "b", "question": "?", "answers": [], "is_impossible": True},
                    ],
                }
            ],
        }
    ],
}


@pytest.mark.parametrize(
    "eval_doc, preds, na, message",
    [
        (None, {"a": "x"}, None, "eval.json: no such file"),
        ("{not json", {"a": "x"}, None, "eval.json: malformed JSON"),
        ({"version": "v2.0"}, {"a": "x"}, None, "eval.json: expected an object with a 'data' list"),
        (
            {"data": [{"paragraphs": [{"context": "c"}]}]},
            {},
            None,
            r"eval.json: data\[0\].paragraphs\[0\] has no 'qas'",
        ),
        (
            {"data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]},
            {},
            None,
            r"eval.json: data\[0\].paragraphs\[0\].qas\[0\] has no string 'id'",
        ),
        ({"data": [{"paragraphs": [{"qas": [{"id": "a"}]}]}]}, {}, None, "eval.json: question a .*'answers'"),
        ({"data": []}, {}, None, "eval.json: no questions"),
        (
            {"version": "1.1", "data": [{"paragraphs": [{"qas": [{"id": "a", "answers": []}]}]}]},
            {"a": "x"},
            None,
            "eval.json: question a has no answers",
        ),
        (V2, ["a"], None, "pred.json: expected an object mapping question id to an answer string"),
        (V2, {"a": "x", "b": 3}, None, "pred.json: question b: expected an answer string, got 3"),
        (V2, {"a": "x"}, None, "pred.json: no prediction for 1 of 2 questions: b"),
        (V2, {"a": "x", "b": ""}, {"a": "high"}, "na.json: question a: expected a number"),
        (V2, {"a": "x", "b": ""}, {"a": 0.5}, "na.json: no no-answer probability for 1 of 2 questions: b"),
        ({"version": "1.1", "data": V2["data"][:0]}, {}, {"a": 0.5}, "eval.json: --na-probs .* v2.0 data only"),
    ],
)
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
    assert done.stderr.strip().splitlines() == [f"bert-squad score: error: {missing}: no such file"]
    assert done.stdout == ""


@pytest.mark.parametrize(
    "target, reason",
    [(lambda d: d, "Is a directory"), (lambda d: d / "no" / "eval.json", "No such file or directory")],
    ids=["directory", "no-parent"],
)
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
        "eval.json",
        "out",
        "pred.json",
    ]


# What each language's rules drop (tests/test_metrics.py works them out by hand): the answer dressed in it
# must still be an exact match under that language's rules, and not under SQuAD's English ones.
# Chinese: a space between adjacent CJK characters, which mixed segmentation splits anyway.
DRESSING = {
    "de": lambda answer: f"Die {answer}«",
    "ar": lambda answer: f"ال{answer}؟",
    "zh": lambda answer: re.sub("(?<=[\u4e00-\u9fa5])(?=[\u4e00-\u9fa5])", " ", answer) + "。",
}


@pytest.mark.parametrize("lang", XQUAD_LANGS)
@pytest.mark.oracle
def test_lang_scores_real_xquad_by_the_languages_rules(tmp_path, lang):
    """On XQuAD's file of the language: the printed line is the in-process score with `lang`, an answer dressed
    in what the language drops scores 100, and the same file under SQuAD's rules does not."""
    eval_file = shared_xquad(lang)
    squad = json.loads(eval_file.read_text())
    preds, _ = random_predictions(squad, seed=5)
    pred_file = write(tmp_path / "pred.json", preds)
    assert scored_line("--eval-file", eval_file, "--predictions", pred_file, "--lang", lang) == metrics.score_v1(
        squad["data"], preds, lang
    )
    dressed = {
        q["id"]: DRESSING[lang](q["answers"][0]["text"])
        for article in squad["data"]
        for para in article["paragraphs"]
        for q in para["qas"]
    }
    dressed_file = write(tmp_path / "dressed.json", dressed)
    assert scored_line("--eval-file", eval_file, "--predictions", dressed_file, "--lang", lang) == {
        "exact_match": 100.0,
        "f1": 100.0,
    }
    assert scored_line("--eval-file", eval_file, "--predictions", dressed_file)["exact_match"] < 50.0
