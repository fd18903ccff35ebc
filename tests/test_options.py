"""The spellings the command line takes: Hugging Face's run_qa.py spellings (underscores) parse to the same run
as this project's own, and mean what Hugging Face's own parser makes of them."""

import dataclasses

import pytest

from bert_squad import answer, config, evaluate

# A value for each training option that has other spellings, none of them its default: a new alias fails
# `test_every_alias_parses_to_the_same_run` until it has one here.
VALUES = {
    "--model": "org/model",
    "--dataset": "squad_v2",
    "--train-file": "train.json",
    "--eval-file": "dev.json",
    "--output-dir": "out",
    "--max-seq-length": "256",
    "--doc-stride": "64",
    "--preprocessing-workers": "3",
    "--max-answer-length": "40",
    "--n-best-size": "7",
    "--null-score-diff-threshold": "0.5",
    "--deepspeed-config": "ds_bf16",
    "--epochs": "3",
    "--max-steps": "100",
    "--learning-rate": "3e-5",
    "--micro-batch-size": "12",
    "--gradient-accumulation-steps": "4",
    "--per-device-eval-batch-size": "16",
    "--report-to": "csv",
    "--warmup-ratio": "0.06",
    "--log-every": "10",
    "--checkpoint-every": "50",
    "--keep-checkpoints": "3",
    "--resume": "auto",
    "--overwrite-output-dir": None,  # a switch
    "--dist-timeout": "900",
    "--compile": None,  # a switch
}
# run_qa.py's own arguments (its ModelArguments and DataTrainingArguments, beside transformers' TrainingArguments)
# that this project takes in their spelling.
RUN_QA = {
    "--model_name_or_path",
    "--dataset_name",
    "--train_file",
    "--validation_file",
    "--preprocessing_num_workers",
    "--max_seq_length",
    "--doc_stride",
    "--max_answer_length",
    "--n_best_size",
    "--null_score_diff_threshold",
}


def aliased():
    return [o for o in config.training_options().values() if o.aliases]


def words(flag, option):
    value = VALUES[option.flag]
    return [flag] if value is None else [flag, value]


def value_of(run, name):
    """A field of the run configuration, whichever group holds it."""
    return next(getattr(group, name) for group in vars(run).values() if name in vars(group))


@pytest.fixture
def parse(tmp_path):
    return lambda argv: config.parse_run_config([*argv, "--cache-dir", str(tmp_path)])


def test_every_alias_parses_to_the_same_run(parse):
    default = parse([])
    for option in aliased():
        own = parse(words(option.flag, option))
        assert value_of(own, option.name) != value_of(default, option.name), option.flag
        for alias in option.aliases:
            assert parse(words(alias, option)) == own, alias
    # All of run_qa.py's spellings at once: the same run as the project's own.
    argv = [w for o in aliased() for w in words(o.flag, o)]
    spelled = [w for o in aliased() for w in words(o.aliases[-1], o)]
    assert parse(spelled) == parse(argv)
    assert RUN_QA <= {a for o in aliased() for a in o.aliases}


def test_hugging_face_reads_its_spellings_as_these_options(parse):
    """The aliases that are transformers' TrainingArguments (run_qa.py's training options), parsed by Hugging
    Face's own HfArgumentParser, give the values this project's options take from the same words."""
    from transformers import HfArgumentParser, TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    shared = [(o, a) for o in aliased() for a in o.aliases if a[2:] in fields]
    assert {a for _, a in shared} >= {
        "--learning_rate",
        "--num_train_epochs",
        "--per_device_train_batch_size",
        "--gradient_accumulation_steps",
        "--per_device_eval_batch_size",
        "--report_to",
        "--deepspeed",
    }
    argv = [w for o, a in shared for w in words(a, o)]
    theirs = HfArgumentParser(TrainingArguments).parse_args(argv)
    ours = parse(argv)
    for option, alias in shared:
        assert getattr(theirs, alias[2:]) == value_of(ours, option.name), alias


@pytest.mark.parametrize("own,alias", [("--model-dir", "--model_name_or_path"), ("--model-dir", "--model-file")])
def test_a_trained_model_takes_the_same_spellings(own, alias, tmp_path):
    argv = ["--eval-file", "dev.json", "--output-dir", "o", "--cache-dir", str(tmp_path), "--max_seq_length", "256"]
    parsed = evaluate.parse([alias, "runs/base", *argv])
    assert parsed == evaluate.parse([own, "runs/base", *argv])
    assert parsed.inference.model.model_dir == "runs/base" and parsed.inference.windows == {"max_seq_length": 256}


def test_answer_takes_run_qas_version_2_switch(tmp_path):
    argv = ["--model-dir", "m", "--question", "q", "--context", "c", "--cache-dir", str(tmp_path)]
    assert answer.parse([*argv, "--version_2_with_negative"]) == answer.parse([*argv, "--version-2-with-negative"])
    assert answer.parse([*argv, "--version_2_with_negative"]) != answer.parse(argv)
