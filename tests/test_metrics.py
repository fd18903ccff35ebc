"""bert_squad.metrics against hand-computed cases and against the official SQuAD scripts.

Every score must equal the official scripts' (not be close), since published numbers come from them.
The oracle that always runs is transformers' port of evaluate-v2.0.py (installed with the package);
verbatim copies of the official scripts in tests/reference/ (never committed: their source forbids
it) add a second oracle where present, which is how the installed one was checked to agree.
"""

import argparse
import importlib.util
import io
import json
import random
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.data.metrics import squad_metrics

from bert_squad.metrics import exact_match, f1, normalize_answer, score, score_v1, score_v2
from conftest import shared_squad

REFERENCE = Path(__file__).resolve().parent / "reference"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def official(version):
    """The official script for `version` ("v1_1" or "v2_0") as a module, or skip."""
    path = REFERENCE / f"evaluate_{version}.py"
    if not path.exists():
        pytest.skip(f"{path} is absent: the official SQuAD script is the oracle of this test")
    spec = importlib.util.spec_from_file_location(f"official_squad_{version}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def official_v1(dataset, predictions):
    with redirect_stderr(io.StringIO()):
        return official("v1_1").evaluate(dataset["data"], predictions)


def official_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
    """What `evaluate-v2.0.py data.json pred.json [--na-prob-file na.json] -t T` outputs, via its main()."""
    ref = official("v2_0")
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
        ref.main()
        return json.loads(out.read_text())


def _questions(dataset):
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def installed_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
    """What evaluate-v2.0.py prints, from transformers' port (same functions, same order).

    `squad_evaluate` adds best_* even without no-answer probabilities; the official script only
    with --na-prob-file, so they are dropped then.
    """
    examples = [SimpleNamespace(qas_id=q["id"], answers=q["answers"]) for q in _questions(dataset)]
    with redirect_stdout(io.StringIO()):  # "Missing prediction for ..."
        result = squad_metrics.squad_evaluate(examples, predictions, na_probs, na_prob_thresh)
    return {k: v for k, v in result.items() if na_probs is not None or not k.startswith("best_")}


def installed_v1(dataset, predictions):
    """What evaluate-v1.1.py prints, from the v2.0 port's per-answer metrics.

    v1.1 keeps references that normalise to nothing, scores a missing prediction 0, and its F1 is 0
    (v2.0: 1) when prediction and reference both normalise to nothing; otherwise they agree.
    """
    exact = f1_sum = total = 0
    for q in _questions(dataset):
        total += 1
        if q["id"] not in predictions:
            continue
        pred, refs = predictions[q["id"]], [a["text"] for a in q["answers"]]
        exact += max(squad_metrics.compute_exact(r, pred) for r in refs)
        if squad_metrics.get_tokens(pred):
            f1_sum += max(squad_metrics.compute_f1(r, pred) for r in refs)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1_sum / total}


def oracle(name):
    """(v1 scorer, v2 scorer, module with the v2.0 per-answer functions) of "installed"/"reference"."""
    if name == "installed":
        return installed_v1, installed_v2, squad_metrics
    return official_v1, official_v2, official("v2_0")


ORACLES = pytest.mark.parametrize("oracle_name", [
    "installed", pytest.param("reference", marks=pytest.mark.skipif(
        not REFERENCE.exists(), reason="tests/reference/ (official scripts, not committed) is absent"))])


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
    with pytest.raises(KeyError):  # the official script cannot score it either
        installed_v2(data, {"a": "x"})


def test_score_picks_the_version():
    v1 = dataset([{"context": "c", "qas": [qa("a", "x")]}], "1.1")["data"]
    assert score(v1, {"a": "x"}) == {"exact_match": 100.0, "f1": 100.0}
    with pytest.raises(ValueError, match="v2.0 data only"):
        score(v1, {"a": "x"}, {"a": 0.5})


# --- against the official scripts ----------------------------------------------------------------

WORDS = ["the", "The", "a", "an", "cat", "Cat's", "sat", "on", "mat.", "naïve", "Café", "ÜBER",
         "1,000", "U.S.", "—", "well-known", "(x)", "日本", "«q»", "theatre", "!", "x"]


@st.composite
def squad_data(draw, v2):
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
            qas.append(qa(f"q{n}", *answers, impossible=impossible if v2 else None))
            n += 1
        paragraphs.append({"context": context, "qas": qas})
    return dataset(paragraphs, "v2.0" if v2 else "1.1")


def draw_predictions(data, draw, allow_missing):
    """Per question: a reference (case/punctuation changed or not), a piece of context, "", junk."""
    preds = {}
    for para in data["data"][0]["paragraphs"]:
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


@ORACLES
@FUZZ
@given(st.data())
def test_score_v1_equals_official(oracle_name, data):
    squad = data.draw(squad_data(v2=False))
    preds = draw_predictions(squad, data.draw, allow_missing=True)
    with redirect_stderr(io.StringIO()):
        assert score_v1(squad["data"], preds) == oracle(oracle_name)[0](squad, preds)


@ORACLES
@FUZZ
@given(st.data())
def test_score_v2_equals_official(oracle_name, data):
    squad = data.draw(squad_data(v2=True))
    preds = draw_predictions(squad, data.draw, allow_missing=False)
    na = data.draw(st.none() | st.fixed_dictionaries(
        {k: st.sampled_from([0.0, 0.2, 0.5, 1.0]) | st.floats(-5, 5) for k in preds}))
    thresh = data.draw(st.sampled_from([1.0, 0.5, 0.0, -1.0]))
    ours = score_v2(squad["data"], preds, na, thresh)
    theirs = oracle(oracle_name)[1](squad, preds, na, thresh)
    assert json.dumps(ours) == json.dumps(theirs)


@ORACLES
@FUZZ
@given(st.text(max_size=12), st.lists(st.text(max_size=12), max_size=3))
def test_single_question_metrics_equal_official_v2(oracle_name, prediction, references):
    ref = oracle(oracle_name)[2]
    golds = [r for r in references if ref.normalize_answer(r)] or [""]
    assert exact_match(prediction, references) == max(ref.compute_exact(g, prediction) for g in golds)
    assert f1(prediction, references) == max(ref.compute_f1(g, prediction) for g in golds)


def random_predictions(squad, seed):
    """Answers a model might give on real data: references, context slices, "", confidences."""
    rng = random.Random(seed)
    preds, na = {}, {}
    for article in squad["data"]:
        for para in article["paragraphs"]:
            ctx = para["context"]
            for q in para["qas"]:
                r = rng.random()
                if r < 0.3 and q["answers"]:
                    preds[q["id"]] = rng.choice(q["answers"])["text"]
                elif r < 0.45:
                    preds[q["id"]] = ""
                else:
                    i = rng.randrange(len(ctx))
                    preds[q["id"]] = ctx[i:i + rng.randrange(1, 60)]
                na[q["id"]] = round(rng.random(), 2)  # rounded: ties, as real confidences have
    return preds, na


@ORACLES
def test_real_dev_v2_equals_official(oracle_name):
    squad = json.loads(shared_squad("dev-v2.0-subset.json").read_text())
    preds, na = random_predictions(squad, seed=1)
    for probs, thresh in ((None, 1.0), (na, 1.0), (na, 0.3)):
        assert json.dumps(score_v2(squad["data"], preds, probs, thresh)) == \
            json.dumps(oracle(oracle_name)[1](squad, preds, probs, thresh))


@ORACLES
def test_real_dev_v1_equals_official(oracle_name):
    squad = json.loads(shared_squad("dev-v1.1-subset.json").read_text())
    preds, _ = random_predictions(squad, seed=2)
    del preds[next(iter(preds))]
    with redirect_stderr(io.StringIO()):
        assert score_v1(squad["data"], preds) == oracle(oracle_name)[0](squad, preds)
