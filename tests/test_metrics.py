"""bert_squad.metrics against hand-computed cases and against the official SQuAD scripts.

Every score must equal the official scripts' (not be close), since published numbers come from them.
The oracles are `evaluate-v1.1.py` and `evaluate-v2.0.py`, byte for byte as the SQuAD authors ship
them, in ../shared/oracles beside the clone (never copied here; tests that need them skip without
them). They are used two ways: run as programs on whole files (their JSON must be ours, key order
included), and loaded as modules (importlib) for per-question scores and fast fuzzing.
"""

import argparse
import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bert_squad.metrics import exact_match, f1, normalize_answer, score, score_v1, score_v2
from helpers import PYTHON, official_module, random_predictions, run_official, shared_oracle, shared_squad

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# One program run per example, each example a batch of many generated datasets. No shrinking (each
# step would run the programs again): the per-question checks, done first, name the question at fault.
FUZZ_BATCHES = settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def official_v1_module():
    return official_module("1.1")


@pytest.fixture(scope="module")
def official_v2_module():
    return official_module("2.0")


def official_v1(dataset, predictions):
    """What `evaluate-v1.1.py` prints, from its `evaluate` (in-process)."""
    with redirect_stderr(io.StringIO()):  # "Unanswered question ... will receive score 0."
        return official_module("1.1").evaluate(dataset["data"], predictions)


def official_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
    """What `evaluate-v2.0.py data.json pred.json [--na-prob-file na.json] -t T` outputs, via its main()."""
    ref = official_module("2.0")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, obj in (("data", dataset), ("pred", predictions), ("na", na_probs)):
            files[name] = None if obj is None else Path(tmp, f"{name}.json")
            if obj is not None:
                files[name].write_text(json.dumps(obj))
        out = Path(tmp, "eval.json")
        ref.OPTS = argparse.Namespace(data_file=files["data"], pred_file=files["pred"],
                                      na_prob_file=files["na"], na_prob_thresh=na_prob_thresh,
                                      out_file=out, out_image_dir=None, verbose=False)
        with redirect_stdout(io.StringIO()):  # "Missing prediction for ..."
            ref.main()
        return json.loads(out.read_text())


def official_v2_per_question(dataset, predictions):
    """evaluate-v2.0.py's per-question (exact, f1) before any no-answer threshold."""
    with redirect_stdout(io.StringIO()):
        exact, f1s = official_module("2.0").get_raw_scores(dataset["data"], predictions)
    return {qid: (exact[qid], f1s[qid]) for qid in exact}


def _questions(dataset):
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def ours_per_question(dataset, predictions):
    return {q["id"]: (exact_match(predictions[q["id"]], refs), f1(predictions[q["id"]], refs))
            for q in _questions(dataset) if q["id"] in predictions
            for refs in [[a["text"] for a in q["answers"]]]}


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


def dataset(paragraphs, version="v2.0"):
    return {"version": version, "data": [{"title": "T", "paragraphs": paragraphs}]}


def qa(qid, *answers, impossible=None):
    q = {"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers]}
    if impossible is not None:
        q["is_impossible"] = impossible
    return q


# --- hand-computed -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, normal", [
    ("The Cat", "cat"),
    ("  a  dog,   an apple!  ", "dog apple"),
    ("theatre", "theatre"),             # articles only as whole words
    ("U.S.-led", "usled"),
    ("Café  Ünïcode", "café ünïcode"),  # non-ASCII letters kept, lowercased
    ("«quoted» — dash", "«quoted» — dash"),  # only ASCII punctuation is removed
    ("", ""),
    ("the", ""),
])
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


def test_exact_and_f1_take_the_best_reference():
    refs = ["Denver Broncos", "the Broncos", "Broncos"]
    assert exact_match("broncos.", refs) == 1.0
    assert f1("Denver", refs) == pytest.approx(2 / 3)  # p=1, r=1/2 against "Denver Broncos"
    assert f1("the Denver Broncos team", refs) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert exact_match("Denver", refs) == 0.0
    assert f1("Carolina Panthers", refs) == 0.0


def test_f1_counts_repeated_tokens_once_per_occurrence():
    assert f1("go go go", ["go"]) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_unanswerable_only_empty_is_right():
    for refs in ([], ["the"], [" . "]):  # no reference, or only ones that normalise to nothing
        assert exact_match("", refs) == f1("", refs) == 1.0
        assert exact_match("a", refs) == 1.0  # normalises to "" too
        assert exact_match("something", refs) == f1("something", refs) == 0.0


def test_empty_prediction_on_answerable_question_scores_zero():
    assert exact_match("", ["Paris"]) == f1("", ["Paris"]) == 0.0


def test_score_v1_hand_computed_and_missing_prediction(capsys):
    data = dataset([{"context": "c", "qas": [qa("1", "Paris"), qa("2", "blue sky"), qa("3", "x")]}], "1.1")
    result = score_v1(data["data"], {"1": "paris", "2": "sky"})
    assert result == {"exact_match": 100.0 / 3, "f1": 100.0 * (1 + 2 / 3) / 3}
    assert "Unanswered question 3 will receive score 0." in capsys.readouterr().err


def test_score_v1_refuses_a_question_without_answers():
    with pytest.raises(ValueError, match="question 1 has no answers"):
        score_v1(dataset([{"context": "c", "qas": [qa("1")]}])["data"], {"1": ""})


def test_score_v2_hand_computed_keys_and_order():
    data = dataset([{"context": "c", "qas": [qa("a", "Paris", impossible=False),
                                             qa("b", impossible=True),
                                             qa("c", impossible=True)]}])["data"]
    preds = {"a": "Paris", "b": "", "c": "Lyon"}
    result = score_v2(data, preds)
    assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                            "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert result["exact"] == result["f1"] == 200.0 / 3 and result["total"] == 3
    assert (result["HasAns_exact"], result["NoAns_exact"]) == (100.0, 50.0)

    na = {"a": 0.1, "b": 0.9, "c": 0.8}
    with_na = score_v2(data, preds, na)
    assert list(with_na)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    # Answering only "a" (threshold 0.1) gets all three right.
    assert (with_na["best_exact"], with_na["best_exact_thresh"]) == (100.0, 0.1)
    # Threshold 0.5: "b" and "c" count as answered "", so "c" becomes right.
    assert score_v2(data, preds, na, na_prob_thresh=0.5)["exact"] == 100.0
    assert score(data, preds, na) == with_na


def test_score_v2_needs_every_prediction_and_probability():
    data = dataset([{"context": "c", "qas": [qa("a", "x", impossible=False), qa("b", impossible=True)]}])
    with pytest.raises(ValueError, match="no prediction for 1 of 2 questions: b"):
        score_v2(data["data"], {"a": "x"})
    with pytest.raises(ValueError, match="no no-answer probability for 1 of 2 questions: a"):
        score_v2(data["data"], {"a": "x", "b": ""}, {"b": 0.5})


@pytest.mark.oracle
def test_official_v2_cannot_score_a_missing_prediction_either(tmp_path):
    """Why score_v2 refuses: the official program crashes (KeyError) rather than score 0."""
    data = dataset([{"context": "c", "qas": [qa("a", "x", impossible=False), qa("b", impossible=True)]}])
    import subprocess

    done = subprocess.run([PYTHON, str(shared_oracle("2.0")), str(write_json(tmp_path / "d.json", data)),
                           str(write_json(tmp_path / "p.json", {"a": "x"}))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Missing prediction for b" in done.stdout and "KeyError: 'b'" in done.stderr


def test_score_picks_the_version():
    v1 = dataset([{"context": "c", "qas": [qa("a", "x")]}], "1.1")["data"]
    assert score(v1, {"a": "x"}) == {"exact_match": 100.0, "f1": 100.0}
    with pytest.raises(ValueError, match="v2.0 data only"):
        score(v1, {"a": "x"}, {"a": 0.5})


# --- against the official scripts ----------------------------------------------------------------

WORDS = ["the", "The", "a", "an", "cat", "Cat's", "sat", "on", "mat.", "naïve", "Café", "ÜBER",
         "1,000", "U.S.", "—", "well-known", "(x)", "日本", "«q»", "theatre", "!", "x"]


@st.composite
def squad_data(draw, v2, prefix=""):
    """A small official-format dataset over a vocabulary full of normalisation traps."""
    paragraphs, n = [], 0
    for _ in range(draw(st.integers(1, 3))):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=10))
        context = " ".join(words)
        qas = []
        for _ in range(draw(st.integers(1, 4))):
            impossible = v2 and draw(st.booleans())
            answers = []
            for _ in range(0 if impossible else draw(st.integers(1, 3))):
                i = draw(st.integers(0, len(words) - 1))
                answers.append(" ".join(words[i:draw(st.integers(i + 1, len(words)))]))
            qas.append(qa(f"{prefix}q{n}", *answers, impossible=impossible if v2 else None))
            n += 1
        paragraphs.append({"context": context, "qas": qas})
    return dataset(paragraphs, "v2.0" if v2 else "1.1")


@st.composite
def squad_batch(draw, v2):
    """Many small datasets as the articles of one file (ids made unique): one oracle run scores them all."""
    parts = draw(st.lists(squad_data(v2), min_size=10, max_size=30))
    articles = []
    for i, part in enumerate(parts):
        article = part["data"][0]
        for para in article["paragraphs"]:
            for q in para["qas"]:
                q["id"] = f"b{i}-{q['id']}"
        articles.append({"title": f"T{i}", "paragraphs": article["paragraphs"]})
    return {"version": "v2.0" if v2 else "1.1", "data": articles}


def draw_predictions(data, draw, allow_missing):
    """Per question: a reference (case/punctuation changed or not), a piece of context, "", junk."""
    preds = {}
    for article in data["data"]:
        for para in article["paragraphs"]:
            words = para["context"].split()
            for q in para["qas"]:
                refs = [a["text"] for a in q["answers"]] or [""]
                choice = draw(st.one_of(
                    st.sampled_from(refs), st.sampled_from(refs).map(lambda r: f" {r.upper()}. "),
                    st.sampled_from(words), st.just(" ".join(words)), st.just(""), st.just(" "),
                    st.text(max_size=8)))
                if not (allow_missing and draw(st.booleans()) and draw(st.booleans())):
                    preds[q["id"]] = choice
    return preds


def na_probs_for(preds):
    """No-answer probabilities (or scores) per question, ties and out-of-range values included."""
    return st.fixed_dictionaries({k: st.sampled_from([0.0, 0.2, 0.5, 1.0]) | st.floats(-5, 5) for k in preds})


THRESHOLDS = st.sampled_from([1.0, 0.5, 0.0, -1.0])


@pytest.mark.oracle
@FUZZ
@given(st.data())
def test_score_v1_equals_official(official_v1_module, data):
    squad = data.draw(squad_data(v2=False))
    preds = draw_predictions(squad, data.draw, allow_missing=True)
    with redirect_stderr(io.StringIO()):
        assert json.dumps(score_v1(squad["data"], preds)) == json.dumps(official_v1(squad, preds))


@pytest.mark.oracle
@FUZZ
@given(st.data())
def test_score_v2_equals_official(official_v2_module, data):
    squad = data.draw(squad_data(v2=True))
    preds = draw_predictions(squad, data.draw, allow_missing=False)
    na = data.draw(st.none() | na_probs_for(preds))
    thresh = data.draw(THRESHOLDS)
    ours = score_v2(squad["data"], preds, na, thresh)
    assert json.dumps(ours) == json.dumps(official_v2(squad, preds, na, thresh))


@pytest.mark.oracle
@FUZZ
@given(st.text(max_size=12), st.lists(st.text(max_size=12), max_size=3))
def test_single_question_metrics_equal_official_v2(official_v2_module, prediction, references):
    ref = official_v2_module
    golds = [r for r in references if ref.normalize_answer(r)] or [""]
    assert normalize_answer(prediction) == ref.normalize_answer(prediction)
    assert exact_match(prediction, references) == max(ref.compute_exact(g, prediction) for g in golds)
    assert f1(prediction, references) == max(ref.compute_f1(g, prediction) for g in golds)


@pytest.mark.oracle
@FUZZ
@given(st.text(max_size=12), st.lists(st.text(max_size=12), min_size=1, max_size=3))
def test_single_question_score_v1_equals_official_v1(official_v1_module, prediction, references):
    ref = official_v1_module
    squad = dataset([{"context": "c", "qas": [qa("q", *references)]}], "1.1")
    ours = score_v1(squad["data"], {"q": prediction})
    assert ours["exact_match"] == 100.0 * ref.metric_max_over_ground_truths(
        ref.exact_match_score, prediction, references)
    assert ours["f1"] == 100.0 * ref.metric_max_over_ground_truths(ref.f1_score, prediction, references)


@pytest.mark.oracle
@FUZZ_BATCHES
@given(st.data())
def test_fuzzed_batch_v1_equals_official_program(tmp_path_factory, data):
    """Dozens of generated datasets in one file: evaluate-v1.1.py run once prints our JSON."""
    squad = data.draw(squad_batch(v2=False))
    preds = draw_predictions(squad, data.draw, allow_missing=True)
    # Per question (the program only prints totals): each question alone, through the module.
    for q in _questions(squad):
        one = {"data": [{"paragraphs": [{"qas": [q]}]}]}
        with redirect_stderr(io.StringIO()):
            assert score_v1(one["data"], preds) == official_v1(one, preds), (q, preds.get(q["id"]))
    tmp = tmp_path_factory.mktemp("batch-v1")
    theirs = run_official("1.1", write_json(tmp / "data.json", squad), write_json(tmp / "pred.json", preds))
    with redirect_stderr(io.StringIO()):
        assert json.dumps(score_v1(squad["data"], preds)) == json.dumps(theirs)


@pytest.mark.oracle
@FUZZ_BATCHES
@given(st.data())
def test_fuzzed_batch_v2_equals_official_program(tmp_path_factory, data):
    """Dozens of generated datasets in one file: evaluate-v2.0.py run once (without and with
    no-answer probabilities) prints our JSON, and its per-question scores are ours."""
    squad = data.draw(squad_batch(v2=True))
    preds = draw_predictions(squad, data.draw, allow_missing=False)
    na = data.draw(na_probs_for(preds))
    thresh = data.draw(THRESHOLDS)
    ours, theirs = ours_per_question(squad, preds), official_v2_per_question(squad, preds)
    assert {q: s for q, s in ours.items() if s != theirs[q]} == {}
    tmp = tmp_path_factory.mktemp("batch-v2")
    files = [write_json(tmp / f"{n}.json", obj) for n, obj in (("data", squad), ("pred", preds), ("na", na))]
    assert json.dumps(score_v2(squad["data"], preds)) == json.dumps(run_official("2.0", *files[:2]))
    assert json.dumps(score_v2(squad["data"], preds, na, thresh)) == \
        json.dumps(run_official("2.0", *files, na_prob_thresh=thresh))


@pytest.mark.oracle
def test_real_dev_v2_equals_official(tmp_path):
    data_file = shared_squad("dev-v2.0-subset.json")
    squad = json.loads(data_file.read_text())
    preds, na = random_predictions(squad, seed=1)
    pred_file, na_file = write_json(tmp_path / "pred.json", preds), write_json(tmp_path / "na.json", na)
    for probs, thresh in ((None, None), (na, None), (na, 0.3)):
        theirs = run_official("2.0", data_file, pred_file, na_file if probs else None, thresh)
        assert json.dumps(score_v2(squad["data"], preds, probs, 1.0 if thresh is None else thresh)) == \
            json.dumps(theirs)
    assert ours_per_question(squad, preds) == official_v2_per_question(squad, preds)


@pytest.mark.oracle
def test_real_dev_v1_equals_official(tmp_path):
    data_file = shared_squad("dev-v1.1-subset.json")
    squad = json.loads(data_file.read_text())
    preds, _ = random_predictions(squad, seed=2)
    del preds[next(iter(preds))]
    theirs = run_official("1.1", data_file, write_json(tmp_path / "pred.json", preds))
    with redirect_stderr(io.StringIO()):
        assert json.dumps(score_v1(squad["data"], preds)) == json.dumps(theirs)
