"""Evaluation on CPU for real: 2 ranks under mpirun give a single process's files byte for byte, and
training evaluates (mid-run and at the end) under every shipped config that runs on CPU."""

import json
import os
import pty
import re
import subprocess
import threading

import pytest
from helpers import (
    MPIRUN,
    PYTHON,
    ROOT,
    V2_BEST_KEYS,
    V2_KEYS,
    inference_args,
    run_bert_squad,
    train_args,
    window_args,
    zero_on_cpu,
)

from bert_squad.metrics import question_ids

pytestmark = pytest.mark.slow

# 96-token windows cut the sample's paragraphs into several windows each (~750 for the v1.1 sample,
# 12 eval batches), so both ranks compute logits and windows of one question land on both.
WINDOWS = window_args(96, 32, 24)
V1_KEYS = ["exact_match", "f1"]
V1_FILES = ["nbest_predictions.json", "predictions.json"]


def file_ids(eval_file):
    return question_ids(json.loads(eval_file.read_text())["data"])


def evaluate(model, eval_file, out, *extra, launcher=()):
    r = run_bert_squad(
        *inference_args("evaluate", model, eval_file, out, *extra, cache=out / "cache", windows=WINDOWS),
        launcher=launcher,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.compat
@pytest.mark.parametrize(
    "dev, keys, files",
    [("sample_dev", V1_KEYS, V1_FILES), ("sample_dev_v2", [*V2_KEYS, *V2_BEST_KEYS], [*V1_FILES, "null_odds.json"])],
)
@pytest.mark.mpi
def test_two_ranks_write_the_single_process_files(request, tiny_model, tmp_path, dev, keys, files):
    eval_file = request.getfixturevalue(dev)
    evaluate(tiny_model, eval_file, tmp_path / "one")
    r = evaluate(tiny_model, eval_file, tmp_path / "two", launcher=MPIRUN)
    assert sorted(p.name for p in (tmp_path / "two").glob("*.json")) == sorted([*files, "eval_metrics.json"])
    for name in files:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert list(json.loads((tmp_path / "two" / "predictions.json").read_text())) == file_ids(eval_file)
    metrics = json.loads((tmp_path / "two" / "eval_metrics.json").read_text())
    assert list(metrics) == [*keys, "eval_file", "questions"]
    assert metrics["questions"] == len(file_ids(eval_file))
    assert json.loads(r.stdout.splitlines()[-1]) == {k: metrics[k] for k in keys}  # printed by rank 0 only


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_one_process_loads_no_deepspeed(command, tiny_model, sample_dev, tmp_path):
    """One process meets no other: it starts no process group and loads no DeepSpeed (several ranks meet through
    DeepSpeed's, and write the same files: above). Run in a fresh interpreter, which says at exit what it loaded."""
    tap = "import atexit, sys\n"
    tap += "atexit.register(lambda: print(*(m in sys.modules for m in ('torch', 'deepspeed')), file=sys.stderr))\n"
    tap += "from bert_squad.cli import main\nsys.exit(main(sys.argv[1:]))"
    args = inference_args(command, tiny_model, sample_dev, tmp_path / "out", cache=tmp_path / "cache", windows=WINDOWS)
    r = subprocess.run([PYTHON, "-c", tap, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == "True False", r.stderr[-3000:]
    assert (tmp_path / "out" / "predictions.json").is_file()


@pytest.mark.compat
@pytest.mark.parametrize(
    "config, launcher",
    [
        pytest.param(lambda tmp: ROOT / "configs" / "ds_fp32.json", (), id="fp32"),
        pytest.param(lambda tmp: ROOT / "configs" / "ds_bf16.json", (), id="bf16"),
        pytest.param(
            lambda tmp: zero_on_cpu(tmp, 2, bf16=True), MPIRUN, id="zero2-bf16-2-ranks", marks=pytest.mark.mpi
        ),
    ],
)
def test_training_evaluates_every_question(tiny_model, sample_train, sample_dev, tmp_path, config, launcher):
    out = tmp_path / "out"
    steps = ["--deepspeed_config", config(tmp_path), "--max-steps", 4, "--eval-every", 2]
    args = train_args(
        tiny_model, sample_train, out, "--eval-file", sample_dev, *steps, cache=tmp_path / "cache", windows=WINDOWS
    )
    r = run_bert_squad(*args, launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval step 2: " in r.stdout
    metrics = json.loads((out / "eval_metrics.json").read_text())
    assert {"exact_match", "f1"} <= set(metrics) and metrics["questions"] == len(file_ids(sample_dev))
    assert list(json.loads((out / "predictions.json").read_text())) == file_ids(sample_dev)


def test_max_answer_length_bounds_every_predicted_span(tiny_model, sample_dev, tmp_path):
    """`--max-answer-length 1`: every prediction is the text of one context token, or empty where no n-best
    start and end pair is that short. With the default (30) the same model predicts longer spans too, so it
    is the option that bounds them."""
    from bert_squad.data import read_squad
    from bert_squad.model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    one_token = {}
    for r in read_squad(sample_dev).records:
        offsets = tokenizer(r["context"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        one_token[r["id"]] = {r["context"][a:b] for a, b in offsets}
    predicted = {}
    for length in (1, 30):
        evaluate(tiny_model, sample_dev, tmp_path / str(length), "--max-answer-length", length)
        predicted[length] = json.loads((tmp_path / str(length) / "predictions.json").read_text())
    longer = {qid for qid, text in predicted[30].items() if text not in one_token[qid]}
    assert longer, "with 30 tokens allowed every prediction is one token: the test shows nothing"
    spans = {qid: text for qid, text in predicted[1].items() if text}
    assert len(spans) > len(predicted[1]) / 2, predicted[1]
    assert all(text in one_token[qid] for qid, text in spans.items()), {
        qid: text for qid, text in spans.items() if text not in one_token[qid]
    }


def without_answers(eval_file, path):
    """`eval_file` as a user's unlabelled file: every question's answers (and v2.0's labels) removed."""
    squad = json.loads(eval_file.read_text())
    for article in squad["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                for key in ("answers", "is_impossible", "plausible_answers"):
                    qa.pop(key, None)
    path.write_text(json.dumps(squad))
    return path


@pytest.mark.mpi
def test_predict_on_two_ranks_writes_evaluations_files_without_answers(tiny_model, sample_dev_v2, tmp_path):
    """`predict` on a file whose answers are gone, on 2 ranks: evaluate's prediction files (one process, the
    labelled file) byte for byte, null odds included for the v2.0 file."""
    evaluate(tiny_model, sample_dev_v2, tmp_path / "eval")
    unlabelled = without_answers(sample_dev_v2, tmp_path / "unlabelled.json")
    args = inference_args(
        "predict", tiny_model, unlabelled, tmp_path / "pred", cache=tmp_path / "cache", windows=WINDOWS
    )
    r = run_bert_squad(*args, launcher=MPIRUN)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "pred").glob("*.json")) == sorted([*V1_FILES, "null_odds.json"])
    for name in [*V1_FILES, "null_odds.json"]:
        assert (tmp_path / "pred" / name).read_bytes() == (tmp_path / "eval" / name).read_bytes(), name
    # evaluate still refuses the unlabelled file: a question without answers cannot be scored
    r = run_bert_squad("evaluate", "--model-dir", tiny_model, "--eval-file", unlabelled, "--output-dir", tmp_path / "x")
    assert r.returncode == 2 and "missing field 'answers'" in r.stderr


def test_evaluate_several_files_prints_a_row_each_and_the_mean(tiny_model, sample_dev, sample_dev_v2, tmp_path):
    """Two eval files, each scored with its own --lang: a folder of predictions each, scored as `score --lang`
    scores them, a table row each and the mean."""
    from bert_squad.metrics import score

    r = evaluate(tiny_model, [sample_dev, sample_dev_v2], tmp_path / "out", "--lang", "de", "zh")
    last = json.loads(r.stdout.splitlines()[-1])
    for eval_file, lang in ((sample_dev, "de"), (sample_dev_v2, "zh")):
        out = tmp_path / "out" / eval_file.stem
        predictions = json.loads((out / "predictions.json").read_text())
        null_odds = json.loads((out / "null_odds.json").read_text()) if lang == "zh" else None
        expected = score(json.loads(eval_file.read_text())["data"], predictions, null_odds, lang=lang)
        assert last["files"][str(eval_file)] == expected
        assert any(line.startswith(str(eval_file)) and f" {lang} " in line for line in r.stdout.splitlines())
    files = list(last["files"].values())
    assert last["mean"]["f1"] == pytest.approx((files[0]["f1"] + files[1]["f1"]) / 2)
    assert r.stdout.splitlines()[-2].startswith("mean")
    three = ["--lang", "de", "zh", "ar"]
    r = run_bert_squad(
        *inference_args("evaluate", tiny_model, [sample_dev, sample_dev_v2], tmp_path / "x", *three, windows=[])
    )
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "--lang: give one language, or one for each of the 2 --eval-file"
    )


def test_predict_offers_no_scoring_language_and_evaluate_does():
    """`predict` scores nothing, so --lang would do nothing there: it is refused, not silently ignored."""
    from bert_squad import evaluate, predict
    from bert_squad.errors import UserError

    common = ["--model-dir", "m", "--output-dir", "o", "--lang", "de"]
    with pytest.raises(UserError, match="unrecognized arguments: --lang de"):
        predict.parse([*common, "--input", "f.json"])
    _, _, (postprocess,) = evaluate.parse([*common, "--eval-file", "f.json"])
    assert postprocess == {"lang": "de"}


def _on_a_terminal(args, timeout=600, stdout_too=False):
    """`python -m bert_squad *args` with stderr (and with `stdout_too` stdout) on a pseudo-terminal, as at a
    person's shell (TERM set): the completed process (stdout, where not on the terminal) and what the terminal was
    sent. A thread drains the terminal as it is written, so the command never blocks on a full one."""
    main, sub = pty.openpty()
    shown = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the command's side is closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
        r = subprocess.run(
            [PYTHON, "-m", "bert_squad", *map(str, args)],
            stdout=sub if stdout_too else subprocess.PIPE, stderr=sub, stdin=subprocess.DEVNULL, text=True, env=env,
            cwd=ROOT,
            timeout=timeout,
        )  # fmt: skip
    finally:
        os.close(sub)
        reader.join(60)
        os.close(main)
    return r, shown.decode(errors="replace")


def test_evaluate_shows_its_progress_as_lines_in_a_log_and_as_a_bar_on_a_terminal(tiny_model, sample_dev, tmp_path):
    """In a log (stderr a file), a line as each tenth of the forward passes is passed, its count and percentage
    its own; on a terminal, rich's bar to the last batch and none of those lines. Both after the plan line."""

    def args(out):
        return inference_args("evaluate", tiny_model, sample_dev, out, cache=tmp_path / "cache", windows=WINDOWS)

    r = run_bert_squad(*args(tmp_path / "log"))
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stderr.splitlines()
    lines = [line for line in said if line.startswith("predict: ")]
    done = [tuple(map(int, re.fullmatch(r"predict: (\d+)/(\d+) batches \((\d+)%\)", line).groups())) for line in lines]
    total = done[0][1]
    assert total > 10 and len(done) == 10, lines  # WINDOWS: more batches than tenths, so one line a tenth
    assert [n * 10 // total for n, _, _ in done] == list(range(1, 11)), lines  # each the first batch past a tenth
    assert all(pct == n * 100 // t for n, t, pct in done) and done[-1][:2] == (total, total), lines
    plan = next(i for i, line in enumerate(said) if "questions" in line and "windows 96/32" in line)
    assert plan < said.index(lines[0])

    r, shown = _on_a_terminal(args(tmp_path / "tty"))
    assert r.returncode == 0, shown[-3000:]
    assert "predict: " not in shown and "batches (" not in shown, shown[-3000:]
    assert re.search(rf"predict ━+ +{total}/{total}\b", _plain(shown)) and f" 0/{total}" in _plain(shown), shown[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]).keys() == {"exact_match", "f1"}


def _plain(shown):
    """What a terminal was sent, its colours and cursor moves left out."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)


def _tenths(said, label):
    """The progress lines `label: N/TOTAL batches (P%)` among the lines `said`, as (N, TOTAL, P)."""
    pattern = rf"{label}: (\d+)/(\d+) batches \((\d+)%\)"
    return [tuple(map(int, m.groups())) for line in said if (m := re.fullmatch(pattern, line))]


def _features(said, pattern):
    """The feature count a plan line (matching `pattern`, which ends where the count starts) states."""
    return next(int(m.group(1)) for line in said if (m := re.search(pattern + r"(\d+) features", line)))


def test_the_eval_batch_size_sets_the_forward_passes_and_not_the_answers(tiny_model, sample_dev, tmp_path):
    """--per-device-eval-batch-size (and run_qa.py's --per_device_eval_batch_size) cuts the eval windows into
    batches of that many: its progress lines count them. The answers are the default batch's (64)."""
    runs = {}
    for size, flag in ((64, None), (16, "--per-device-eval-batch-size"), (5, "--per_device_eval_batch_size")):
        r = evaluate(tiny_model, sample_dev, tmp_path / str(size), *([flag, size] if flag else []))
        said = r.stderr.splitlines()
        windows = _features(said, r"questions, ")
        assert {t for _, t, _ in _tenths(said, "predict")} == {-(-windows // size)}, said
        runs[size] = json.loads((tmp_path / str(size) / "predictions.json").read_text())
    assert runs[16] == runs[64] == runs[5]
    r = run_bert_squad(
        *inference_args("predict", tiny_model, sample_dev, tmp_path / "p", "--per-device-eval-batch-size", 0)
    )
    assert r.returncode == 2 and "--per-device-eval-batch-size must be positive, not 0" in r.stderr


def test_training_shows_its_evaluations_progress_as_evaluate_does(tiny_model, sample_train, sample_dev, tmp_path):
    """In a log, each evaluation of a training (mid-run and the final one) prints a line at each tenth of its
    forward passes, as `evaluate` does, in the training's log (stdout), each batch of --per-device-eval-batch-size
    windows; on a terminal, an eval row of the training's own bar (the final one's bar its own) and no lines."""

    def args(out, *extra):
        steps = ["--max-steps", 4, "--eval-every", 2, "--log-every", 2, "--per-device-eval-batch-size", 8, *extra]
        cache = tmp_path / "cache"
        return train_args(
            tiny_model, sample_train, out, "--eval-file", sample_dev, *steps, cache=cache, windows=WINDOWS
        )

    r = run_bert_squad(*args(tmp_path / "log"))
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout.splitlines()
    total = -(-_features(said, rf"eval {sample_dev}: \d+ questions, ") // 8)
    done = _tenths(said, "eval")
    assert total > 10 and len(done) == 20 and {t for _, t, _ in done} == {total}, said
    assert [n * 10 // total for n, _, _ in done] == [*range(1, 11)] * 2, said
    assert said.index("eval: " + f"{total}/{total} batches (100%)") < next(
        i for i, line in enumerate(said) if line.startswith("eval step 2: ")
    )

    r, shown = _on_a_terminal(args(tmp_path / "tty"), stdout_too=True)
    assert r.returncode == 0, shown[-3000:]
    assert "eval: " not in shown and "batches (" not in shown, shown[-3000:]
    plain = _plain(shown)
    assert re.search(rf"eval ━+ +{total}/{total}\b", plain) and re.search(r"train ━+ +4/4\b", plain), plain[-3000:]
