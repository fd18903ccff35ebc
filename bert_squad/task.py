"""What a trained model was trained to do, recorded beside its weights: the windows its inputs were cut into,
the rules that made its answers, and the language its answers were scored in.

Training writes `bert_squad_task.json` into every export (and into each checkpoint's `hf/`, which `bert-squad
export` copies), and every command that loads a model (`evaluate`, `predict`, `answer`, `bert-squad-test`,
the `Answerer` API) takes its settings from it, so a model answers as it was trained and evaluated. An option
given on the command line wins; a model without the file (one from the hub) gets the options' defaults. Which
value came from where is said in one line (`Settings.line`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_squad.config import PostprocessConfig, WindowConfig, from_record
from bert_squad.errors import UserError
from bert_squad.files import PathLike, read_json, write_json_atomic
from bert_squad.outputs import TASK_FILE


@dataclass(frozen=True)
class Task:
    """How a model was trained to answer."""

    windows: WindowConfig
    postprocess: PostprocessConfig  # the answer rules and scoring language its evaluation used
    version_2_with_negative: bool  # trained on SQuAD v2.0: "no answer" competes with the spans

    def as_dict(self) -> dict[str, Any]:
        return {
            "windows": dataclasses.asdict(self.windows),
            "answers": dataclasses.asdict(self.postprocess),
            "version_2_with_negative": self.version_2_with_negative,
        }

    def write(self, model_dir: PathLike) -> None:
        """Into the model directory `model_dir` (atomically): an export, or a checkpoint's `hf/`."""
        write_json_atomic(Path(model_dir) / TASK_FILE, self.as_dict())


def recorded(model_dir: PathLike) -> Task | None:
    """The task `model_dir` records; None where it records none. A file that is there but unreadable, or holds a
    value its option would refuse, is one error line naming it."""
    path = Path(model_dir) / TASK_FILE
    if not path.is_file():
        return None
    saved = read_json(path, what="a model's task settings")
    if not isinstance(saved, dict) or not {"windows", "answers", "version_2_with_negative"} <= saved.keys():
        raise UserError(f"{path}: not a bert-squad task file (it has windows, answers and version_2_with_negative)")
    windows, answers, v2 = saved["windows"], saved["answers"], saved["version_2_with_negative"]
    try:
        for name, group in ("windows", windows), ("answers", answers):
            if not isinstance(group, dict):
                raise UserError(f"{name} is {json.dumps(group)}, not an object")
        if not isinstance(v2, bool):
            raise UserError(f"version_2_with_negative is {json.dumps(v2)}, not true or false")
        return Task(
            from_record(WindowConfig, windows, "windows"), from_record(PostprocessConfig, answers, "answers"), v2
        )
    except UserError as err:
        raise UserError(f"{path}: {err}") from None


def recorded_mode(model_dir: PathLike, trained: Task | None) -> bool | None:
    """Whether the model in `model_dir` was trained to answer "no answer" (SQuAD v2.0): its task record's
    `version_2_with_negative`, else the one an export written before the record existed kept in its config.json;
    None for a model that records neither (one from the hub)."""
    if trained is not None:
        return trained.version_2_with_negative
    path = Path(model_dir) / "config.json"
    saved = read_json(path, what="a model config") if path.is_file() else None
    mode = saved.get("version_2_with_negative") if isinstance(saved, dict) else None
    return mode if isinstance(mode, bool) else None


def no_answer(recorded: bool | None, file_version_2: bool) -> bool:
    """The one rule for whether "no answer" competes with the spans, for every command that answers: what the model
    was trained on (`recorded`, `recorded_mode`; the file's version does not change it); for a model that records
    nothing, the version of the file it answers (`file_version_2`: SQuAD v2.0, unanswerable questions in it)."""
    return file_version_2 if recorded is None else recorded


@dataclass(frozen=True)
class Settings:
    """The windows and answer rules a command uses with a model, and where they came from."""

    windows: WindowConfig
    postprocess: PostprocessConfig
    trained: Task | None  # what the model records; None for a model without the file
    line: str  # which values came from the model and which were given, for the command's plan line
    version_2_with_negative: bool | None = None  # the model's recorded v2.0 mode (`recorded_mode`)

    def no_answer(self, file_version_2: bool) -> bool:
        """Whether "no answer" competes with the spans for this model on a file (`no_answer`)."""
        return no_answer(self.version_2_with_negative, file_version_2)

    def no_answer_text(self, file_version_2: bool) -> str:
        """The plan line's words for `no_answer`, with the file's version checked against the model's."""
        competes = self.no_answer(file_version_2)
        what = '"no answer" competes' if competes else 'no "no answer"'
        if self.version_2_with_negative is None:
            return f"{what} (the file is SQuAD {'v2.0' if file_version_2 else 'v1.1'}; the model records no version)"
        trained = f"trained on SQuAD {'v2.0' if competes else 'v1.1'}"
        if file_version_2 and not competes:
            return f"{what} ({trained}: the file's unanswerable questions are answered with a span)"
        return f"{what} ({trained})"


def resolve(model_dir: PathLike, windows: Mapping[str, Any], postprocess: Mapping[str, Any]) -> Settings:
    """The settings for `model_dir`: each option given (`windows`, `postprocess`: the fields the command line or
    caller gave) wins over what the model records, which wins over the option's default. Given values are
    checked here, with the model's, so a stride that fits the trained window but not the default one is fine."""
    trained = recorded(model_dir)
    base_windows = dataclasses.asdict(trained.windows) if trained else {}
    base_answers = dataclasses.asdict(trained.postprocess) if trained else {}
    if "max_seq_length" in windows and "doc_stride" not in windows:
        base_windows.pop("doc_stride", None)  # a stride follows a given window unless given itself
    resolved_windows = WindowConfig(**{**base_windows, **windows})
    resolved_answers = PostprocessConfig(**{**base_answers, **postprocess})
    parts = [
        _part("windows", _windows_text(resolved_windows), windows, _windows_text(trained.windows) if trained else None),
        _part(
            "answers",
            _answers_text(resolved_answers),
            postprocess,
            _answers_text(trained.postprocess) if trained else None,
        ),
    ]
    if trained is None:
        parts.append(f"{model_dir} records no settings of its training ({TASK_FILE})")
    mode = recorded_mode(model_dir, trained)
    return Settings(resolved_windows, resolved_answers, trained, "; ".join(parts), mode)


def _windows_text(w: WindowConfig) -> str:
    return f"{w.max_seq_length}/{w.doc_stride}, questions up to {w.max_query_length} tokens"


def _answers_text(p: PostprocessConfig) -> str:
    lang = f", scored as {p.lang}" if p.lang else ""
    return (
        f"up to {p.max_answer_length} tokens, n-best {p.n_best_size}, null threshold "
        f"{p.null_score_diff_threshold:g}{lang}"
    )


def _part(name: str, text: str, given: Mapping[str, Any], trained: str | None) -> str:
    """'windows 384/128 ... (given; trained on 256/64 ...)': a group's values and where they came from."""
    if not given:
        return f"{name} {text} ({'as trained' if trained else 'defaults'})"
    if trained is None or trained == text:
        return f"{name} {text} (given{'' if trained is None else ', as trained'})"
    return f"{name} {text} (given; trained on {trained})"
