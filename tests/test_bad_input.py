"""Every bad input ends in one error line naming the culprit, exit code 2, and nothing written."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_squad.cli import main
from bert_squad.dsconfig import SHIPPED_DIR as CONFIG_DIR
from bert_squad.data import read_squad
from bert_squad.errors import UserError


def squad(qas, context="Ada was born in Lugano.", version="1.1"):
    return {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


GOOD_QA = {"id": "q1", "question": "Where?", "answers": [{"text": "Lugano", "answer_start": 16}]}


def run_cli(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.fixture
def files(tmp_path, tiny_model):
    def write(name, content):
        p = tmp_path / name
        p.write_text(content if isinstance(content, str) else json.dumps(content))
        return p

    return write


CASES = {
    "malformed JSON": (lambda w: ["--train-file", w("t.json", '{"data": [')], r"t.json: malformed JSON at line 1"),
    "truncated JSON": (lambda w: ["--train-file", w("t.json", json.dumps(squad([GOOD_QA]))[:-20])],
                       r"t.json: malformed JSON"),
    "missing file": (lambda w: ["--train-file", "/nonexistent/train.json"], r"/nonexistent/train.json: no such file"),
    "missing context": (lambda w: ["--train-file", w("t.json", {"data": [{"title": "T", "paragraphs": [{"qas": []}]}]})],
                        r"t.json: article 0 \('T'\) paragraph 0: missing field 'context'"),
    "missing question": (lambda w: ["--train-file", w("t.json", squad([{"id": "q7", "answers": []}]))],
                         r"t.json: question q7: missing field 'question'"),
    "missing answers": (lambda w: ["--train-file", w("t.json", squad([{"id": "q8", "question": "?"}]))],
                        r"t.json: question q8: missing field 'answers'"),
    "answer_start off, strict": (
        lambda w: ["--strict", "--train-file",
                   w("t.json", squad([dict(GOOD_QA, answers=[{"text": "Lugano", "answer_start": 3}])]))],
        r"t.json: question q1: answer_start does not point at the answer text"),
    "empty question, strict": (
        lambda w: ["--strict", "--train-file", w("t.json", squad([GOOD_QA, dict(GOOD_QA, id="q5", question=" \t")]))],
        r"t.json: question q5: empty question \(--strict"),
    "empty eval question, strict": (
        lambda w: ["--strict", "--eval-file", w("d.json", squad([dict(GOOD_QA, id="q6", question="")]))],
        r"d.json: question q6: empty question"),
    "empty context": (lambda w: ["--train-file", w("t.json", squad([GOOD_QA], context="  "))],
                      r"t.json: article 0 \('T'\) paragraph 0: empty context"),
    "unknown dataset": (lambda w: ["--dataset", "squad_v3"], r"unknown dataset 'squad_v3'"),
    "model path not a model": (lambda w: ["--model", str(w("t.json", "x").parent)], r"not a model directory"),
    "unknown ds_config key": (lambda w: ["--deepspeed_config", w("c.json", {"train_micro_batch_size_per_gpu": 4,
                                                                           "zero_optimisation": {"stage": 2}})],
                              r"c.json: unknown key 'zero_optimisation'"),
    "impossible batch arithmetic": (
        lambda w: ["--deepspeed_config", w("c.json", {"train_batch_size": 10, "gradient_accumulation_steps": 3})],
        r"c.json: train_batch_size 10 is not divisible by gradient_accumulation_steps 3"),
    "fp16 on CPU": (lambda w: ["--deepspeed_config", str(CONFIG_DIR / "ds_fp16.json")], r"fp16.enabled needs a GPU"),
    "output dir not writable": (lambda w: ["--output-dir", "/proc/nope/out"], r"/proc/nope/out: output dir cannot be written"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_nothing_written(case, files, tiny_model, sample_train, tmp_path, capsys):
    make_args, pattern = CASES[case]
    out = tmp_path / "out"
    extra = [str(a) for a in make_args(files)]
    argv = ["--model", str(tiny_model), "--train-file", str(sample_train), "--output-dir", str(out),
            "--cache-dir", str(tmp_path / "cache"), "--max-steps", "1", *extra]
    code, err = run_cli(capsys, argv)
    assert code == 2
    assert len(err) == 1, err
    import re

    assert err[0].startswith("bert-squad: error: ") and re.search(pattern, err[0]), err[0]
    assert not out.exists()


def test_answer_start_mismatch_is_counted_and_skipped(tmp_path):
    bad = dict(GOOD_QA, id="q2", answers=[{"text": "Lugano", "answer_start": 3}])
    p = tmp_path / "t.json"
    p.write_text(json.dumps(squad([GOOD_QA, bad])))
    ex = read_squad(p)
    assert [r["id"] for r in ex.records] == ["q1"] and ex.skipped_ids == ["q2"]


def test_empty_questions_are_counted_and_skipped(tmp_path):
    qas = [GOOD_QA, dict(GOOD_QA, id="q2", question=""), dict(GOOD_QA, id="q3", question=" \n "),
           dict(GOOD_QA, id="q4", answers=[{"text": "Lugano", "answer_start": 3}])]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(squad(qas)))
    ex = read_squad(p)
    assert [r["id"] for r in ex.records] == ["q1"]
    assert ex.empty_question_ids == ["q2", "q3"] and ex.skipped_ids == ["q4"]
    assert ex.skip_summary() == "1 questions skipped (answer_start off its text), 2 skipped (empty question)"


def test_debug_shows_the_traceback(tmp_path, capsys):
    code = main(["--debug", "--train-file", str(tmp_path / "missing.json"), "--model", str(tmp_path)])
    assert code == 2
    assert "Traceback" in capsys.readouterr().err


# --- fuzzing: nothing but UserError, whatever the file holds --------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["data", "paragraphs", "context", "qas", "id", "question", "answers", "text",
                         "answer_start", "is_impossible", "title"]), inner, max_size=5),
    max_leaves=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values)
def test_fuzz_reader_raises_only_user_errors(doc, tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps(doc))
    try:
        ex = read_squad(p)
    except UserError as err:
        assert str(err).startswith(str(p))
    else:
        for r in ex.records:
            for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"]):
                assert r["context"][s:s + len(t)] == t


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_feature_labels_stay_in_their_window(data, tiny_model, tmp_path_factory):
    from bert_squad.config import WindowConfig
    from bert_squad.features import _tokenize, prepare_train
    from bert_squad.model import load_tokenizer

    tok = load_tokenizer(tiny_model)
    words = st.sampled_from(["Ada", "was", "born", "in", "Lugano", "1834", ",", ".", "the", "née", "co-op",
                             "  ", "\n", "x" * 30, "ünï", "Krakow's", "(", ")"])
    context = "".join(data.draw(st.lists(words.map(lambda w: w + data.draw(st.sampled_from([" ", "", "  "]))),
                                         min_size=1, max_size=120)))
    if not context.strip():
        return
    start = data.draw(st.integers(0, len(context) - 1))
    end = data.draw(st.integers(start + 1, min(len(context), start + 40)))
    answer = context[start:end]
    rec = {"id": "f", "title": "", "context": context, "question": data.draw(st.text(min_size=1, max_size=40)),
           "answers": {"text": [answer], "answer_start": [start]}, "is_impossible": False}
    win = WindowConfig(data.draw(st.integers(32, 96)), data.draw(st.integers(4, 16)), data.draw(st.integers(4, 12)))
    batch = {k: [v] for k, v in dict(rec, index=0).items()}
    enc = prepare_train(batch, tok, win)
    offsets = _tokenize(batch, tok, win)["offset_mapping"]
    for i, (s, e) in enumerate(zip(enc["start_positions"], enc["end_positions"])):
        n = len(enc["input_ids"][i])
        assert 0 <= s <= e < n and n <= win.max_seq_length
        if s:
            seq = enc.sequence_ids(i)
            assert seq[s] == 1 and seq[e] == 1  # inside the context part of this window
            assert offsets[i][s][0] < end and offsets[i][e][1] > start  # and on the answer's characters
