"""`bert_squad.answer`: the Answerer API and `bert-squad answer` answer as evaluation scores, and bad
input is one line."""

import json

import pytest
from helpers import inference_args, run_bert_squad, window_args

from bert_squad.answer import Answerer
from bert_squad.config import PostprocessConfig, WindowConfig
from bert_squad.data import read_squad

pytestmark = pytest.mark.slow

WINDOWS = WindowConfig(max_seq_length=128, doc_stride=48)  # the sample's contexts take several windows


def run_answer(*args, timeout=300):
    return run_bert_squad("answer", *args, timeout=timeout, env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def qa(tiny_model):
    return Answerer.from_pretrained(tiny_model, windows=WINDOWS)


@pytest.mark.compat
def test_answers_are_spans_of_their_context_best_first(qa, sample_dev):
    records = read_squad(sample_dev).records[:12]
    pairs = [(r["question"], r["context"]) for r in records]
    batched = qa.answer_batch(pairs, top_k=5)
    assert len(batched) == len(pairs)
    for (question, context), answers in zip(pairs, batched):
        assert 1 <= len(answers) <= 5
        assert all(context[a.start : a.end] == a.text != "" for a in answers)  # v1.1 model: spans only
        scores = [a.score for a in answers]
        assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
        assert qa.answer(question, context, top_k=5) == answers  # one by one as in a batch


@pytest.mark.compat
def test_the_cli_answers_as_evaluation_predicts(tiny_model, sample_dev_v2, tmp_path):
    """The same windows and post-processing: `answer --input` over a dev file's questions gives the
    predictions `bert-squad evaluate` wrote for it, the null answer included."""
    windows = window_args(WINDOWS.max_seq_length, WINDOWS.doc_stride, None)

    def evaluate(threshold):
        out = tmp_path / f"eval{threshold}"
        null = ["--null-score-diff-threshold", threshold]
        ev = run_bert_squad(
            *inference_args(
                "evaluate", tiny_model, sample_dev_v2, out, *null, cache=tmp_path / "cache", windows=windows
            ),
            timeout=300,
        )
        assert ev.returncode == 0, ev.stderr
        return out

    # A threshold at the median null odds, so that both kinds of answer occur.
    odds = sorted(json.loads((evaluate(0.0) / "null_odds.json").read_text()).values())
    threshold = odds[len(odds) // 2]
    predictions = json.loads((evaluate(threshold) / "predictions.json").read_text())
    done = run_answer(
        "--model-dir",
        tiny_model,
        "--version-2-with-negative",
        "--null-score-diff-threshold",
        threshold,
        "--json",
        "--input",
        jsonl(tmp_path, read_squad(sample_dev_v2).records),
        *windows,
    )
    assert done.returncode == 0, done.stderr
    answered = {r["id"]: r["answers"][0]["text"] for r in map(json.loads, done.stdout.splitlines())}
    assert answered == predictions
    assert "" in answered.values() and set(answered.values()) != {""}


def jsonl(tmp_path, records):
    path = tmp_path / "questions.jsonl"
    path.write_text(
        "".join(json.dumps({"id": r["id"], "question": r["question"], "context": r["context"]}) + "\n" for r in records)
    )
    return path


@pytest.mark.compat
@pytest.mark.parametrize("threshold, expect_null", [(-1e9, True), (1e9, False)])
def test_null_threshold_decides_between_no_answer_and_a_span(tiny_model, sample_dev, threshold, expect_null):
    qa = Answerer.from_pretrained(
        tiny_model,
        windows=WINDOWS,
        postprocess=PostprocessConfig(null_score_diff_threshold=threshold),
        null_answer=True,
    )
    records = read_squad(sample_dev).records[:6]
    for answers in qa.answer_batch([(r["question"], r["context"]) for r in records], top_k=50):
        assert (answers[0].text == "" and answers[0].start is None) == expect_null
        assert sum(a.start is None for a in answers) == 1  # the null answer is always one candidate


def test_rich_output_shows_question_and_answer(tiny_model, tmp_path):
    context = "Ada Novak was born in Lugano in 1834. She studied physics at the university."
    (tmp_path / "ctx.txt").write_text(context)
    done = run_answer(
        "--model-dir",
        tiny_model,
        "--question",
        "Where was Ada Novak born?",
        "--context-file",
        tmp_path / "ctx.txt",
        "--top-k",
        2,
    )
    assert done.returncode == 0, done.stderr
    assert "Where was Ada Novak born?" in done.stdout and "1. " in done.stdout and "2. " in done.stdout
    [best] = Answerer.from_pretrained(tiny_model).answer("Where was Ada Novak born?", context)
    assert f"1. {best.text}" in done.stdout


BAD_LINES = {
    "not JSON": ('{"question": "Who?"', "questions.jsonl:2: malformed JSON at line 1"),
    "not an object": ('["Who?", "Ada"]', "questions.jsonl:2: a line is a JSON object"),
    "no context": ('{"question": "Who?"}', "questions.jsonl:2: field 'context' should be a non-empty string"),
    "empty question": ('{"question": "  ", "context": "Ada"}', "questions.jsonl:2: field 'question' should be"),
    "repeated id": ('{"question": "Who?", "context": "Ada", "id": 1}', "questions.jsonl: id '1' repeats"),
    "nested too deep": ("[" * 100_000 + "]" * 100_000, "questions.jsonl:2: JSON nested deeper than the parser allows"),
}


@pytest.mark.parametrize("case", BAD_LINES)
def test_a_bad_input_line_is_named(tiny_model, tmp_path, case):
    line, message = BAD_LINES[case]
    path = tmp_path / "questions.jsonl"
    path.write_text('{"question": "Who?", "context": "Ada wrote it.", "id": 1}\n' + line + "\n")
    done = run_answer("--model-dir", tiny_model, "--input", path)
    assert done.returncode == 2
    [err] = done.stderr.splitlines()
    assert err.startswith("bert-squad answer: error: ") and message in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--question", "", "--context", "Ada wrote it."], "--question is empty"),
        (["--question", "Who?", "--context", " \n"], "--context: the context is empty"),
        (["--question", "Who?", "--context-file", "/nonexistent/ctx.txt"], "/nonexistent/ctx.txt: no such file"),
        (["--question", "Who?"], "--question needs --context or --context-file"),
        (["--question", "Who?", "--context", "Ada wrote it.", "--device", "tpu"], "device 'tpu' is not usable here"),
    ],
    ids=["empty-question", "empty-context", "no-context-file", "no-context", "bad-device"],
)
def test_bad_question_or_context_is_one_line(tiny_model, args, message):
    done = run_answer("--model-dir", tiny_model, *args)
    assert done.returncode == 2
    assert message in done.stderr.splitlines()[-1], done.stderr


@pytest.mark.compat
def test_a_tokenizer_that_pads_on_the_left_answers_the_same(tiny_model, qa, sample_dev, tmp_path):
    """Features are never padded by the tokenizer (the collator pads on the right), so its side is moot."""
    import shutil

    left = tmp_path / "left"
    shutil.copytree(tiny_model, left)
    config = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps(dict(config, padding_side="left")))
    qa_left = Answerer.from_pretrained(left, windows=WINDOWS)
    assert qa_left.tokenizer.padding_side == "left"
    pairs = [(r["question"], r["context"]) for r in read_squad(sample_dev).records[:8]]
    assert qa_left.answer_batch(pairs, top_k=3) == qa.answer_batch(pairs, top_k=3)


def test_the_api_shows_no_progress_bar_per_call(tiny_model):
    """A user's script (a fresh interpreter, none of the CLI's set-up) asks twice: no progress bar of the
    features built for each call reaches its stderr, and datasets' bars are as the script left them."""
    import os
    import subprocess

    from helpers import PYTHON, ROOT

    script = (
        "import sys, datasets\n"
        "from bert_squad.answer import Answerer\n"
        "qa = Answerer.from_pretrained(sys.argv[1])\n"
        "print('asking', file=sys.stderr, flush=True)\n"
        "for _ in range(2):\n"
        "    qa.answer('Who wrote it?', 'Ada wrote it in 1843.')\n"
        "assert datasets.is_progress_bar_enabled()\n"
    )
    env = {k: v for k, v in os.environ.items() if "PROGRESS" not in k}
    done = subprocess.run(
        [PYTHON, "-c", script, str(tiny_model)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.split("asking\n", 1)[1] == "", done.stderr[-3000:]
