"""Model and tokenizer: loaded from a local directory (`cache.find_model` resolves hub names to one), never
from the network; exported in Hugging Face format so `AutoModelForQuestionAnswering` (transformers 4
and 5) and `bert_squad.answer.Answerer` load it.

An encoder family transformers ships without a question-answering class gets the project's span head
(`span_head.py`); its exports carry that file, so transformers alone loads them (with trust_remote_code).
"""

import contextlib
import copy
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union, cast

from bert_squad import files, outputs
from bert_squad.errors import UserError, first_line

if TYPE_CHECKING:  # transformers, torch and DeepSpeed load with the model, not for the commands that load none
    import torch
    from deepspeed import DeepSpeedEngine
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

    from bert_squad.task import Task

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Family:
    """An encoder family the project names, the class it loads for it (its question-answering class, or its
    encoder where transformers has no such class: the span head goes on it), and where that class is newer than
    the oldest transformers the project supports (setup.cfg's floor), the first release whose wheel has it."""

    name: str  # as docs/models.md names it
    model_type: str  # config.json's model_type
    loads: str  # the transformers class the project loads
    since: Optional[str] = None  # the first release whose wheel has `loads`; None: every supported release has it


FAMILIES = (
    Family("BERT", "bert", "BertForQuestionAnswering"),
    Family("DistilBERT", "distilbert", "DistilBertForQuestionAnswering"),
    Family("RoBERTa", "roberta", "RobertaForQuestionAnswering"),
    Family("ELECTRA", "electra", "ElectraForQuestionAnswering"),
    Family("DeBERTa-v3", "deberta-v2", "DebertaV2ForQuestionAnswering"),
    Family("ModernBERT", "modernbert", "ModernBertForQuestionAnswering", "4.51.0"),
    Family("XLM-RoBERTa", "xlm-roberta", "XLMRobertaForQuestionAnswering"),
    Family("mDeBERTa-v3", "deberta-v2", "DebertaV2ForQuestionAnswering"),
    Family("mmBERT", "modernbert", "ModernBertForQuestionAnswering", "4.51.0"),
    Family("EuroBERT", "eurobert", "EuroBertModel", "5.3.0"),
)


def family(model_type: str) -> Optional[Family]:
    """The first family of FAMILIES with this model type (DeBERTa-v3 for deberta-v2, ModernBERT for modernbert)."""
    return next((f for f in FAMILIES if f.model_type == model_type), None)


def _check_model_type(model_dir: PathLike) -> None:
    """A family newer than the installed transformers fails in its tokenizer with a message about the
    tokenizer file, in its config with a paragraph, or (ModernBERT on 4.48-4.50) only where its missing
    question-answering class is looked up: name the real cause and the release that has it, in one line."""
    import transformers  # heavy: not for the commands that load no model
    from packaging.version import Version  # transformers' own dependency, loaded with it
    from transformers import CONFIG_MAPPING

    try:
        model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # no readable config: the loaders say what is wrong with the directory
    if not isinstance(model_type, str):
        return
    known = family(model_type)
    if known and known.since and Version(transformers.__version__) < Version(known.since):
        raise UserError(
            f"{model_dir}: a {known.name} model ({model_type}) needs transformers >= {known.since}, the "
            f"first release with {known.loads}; this is transformers {transformers.__version__} "
            f"(docs/models.md)"
        )
    if model_type not in CONFIG_MAPPING:
        raise UserError(
            f"{model_dir}: model type '{model_type}' is unknown to transformers "
            f"{transformers.__version__}: a newer transformers has it (docs/models.md)"
        )


def load_tokenizer(model_dir: PathLike) -> "PreTrainedTokenizerFast":
    from transformers import AutoTokenizer  # heavy: not for the commands that load no model

    _check_model_type(model_dir)
    # Any failure to read a user's directory (missing files, a slow-only tokenizer needing protobuf or
    # sentencepiece, malformed JSON) is a problem with that directory, said in one line.
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:
        raise UserError(f"{model_dir}: cannot load a tokenizer ({first_line(err)})") from None
    # transformers 5 builds an empty vocabulary where no tokenizer file exists; every word would be [UNK].
    if not any((Path(model_dir) / name).is_file() for name in tok.vocab_files_names.values()):
        raise UserError(
            f"{model_dir}: cannot load a tokenizer (none of its files: "
            f"{', '.join(sorted(tok.vocab_files_names.values()))})"
        )
    if not tok.is_fast:
        raise UserError(f"{model_dir}: needs a fast tokenizer (tokenizer.json) for offset mappings")
    return cast("PreTrainedTokenizerFast", tok)


def load_qa_model(
    model_dir: PathLike,
    say: Optional[Callable[[str], None]] = None,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
) -> "PreTrainedModel":
    """A question-answering model in fp32 (DeepSpeed casts it to the run's precision and keeps fp32 master
    weights; a checkpoint saved in bf16 would otherwise train in bf16 under an fp32 config). An encoder
    checkpoint gets a new span head (that is fine-tuning): transformers' own where the family has one, the
    project's (`span_head.py`) where it has none. `say(line)` is told what the project's head left out of
    the checkpoint (a masked-LM head). `dropout` and `attention_dropout` replace the config's rates
    (`set_dropout`), so the export records what the model trained with.

    transformers picks SDPA attention by itself where the family has it (DeBERTa has not)."""
    from bert_squad import span_head  # imports transformers: not for the commands that load no model

    config = _config(model_dir)
    set_dropout(config, model_dir, dropout, attention_dropout)
    qa_class = _qa_class(config, model_dir)
    with _quiet_loading():
        try:
            module, info = qa_class.from_pretrained(
                str(model_dir), config=config, local_files_only=True, output_loading_info=True
            )
        except Exception as err:  # truncated or foreign weights, an architecture without a QA head, ...
            raise UserError(f"{model_dir}: cannot load model weights ({_weights_reason(err)})") from None
    if issubclass(qa_class, span_head.SpanHead):
        _check_encoder_loaded(model_dir, config, info, say)
    return module.float()


def empty_qa_model(model_dir: PathLike) -> "PreTrainedModel":
    """The question-answering model the config in `model_dir` describes (a checkpoint's `hf/`), randomly
    initialised: its weights come from elsewhere."""
    from transformers import AutoModelForQuestionAnswering  # heavy: not for the commands that load no model

    config = _config(model_dir)
    qa_class = _qa_class(config, model_dir)
    with _quiet_loading():
        if qa_class is AutoModelForQuestionAnswering:
            return qa_class.from_config(config)
        return qa_class._from_config(config)


def _config(model_dir: PathLike) -> "PretrainedConfig":
    from transformers import AutoConfig  # heavy: not for the commands that load no model

    _check_model_type(model_dir)
    try:
        return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:
        raise UserError(f"{model_dir}: not a model directory ({first_line(err)})") from None


def dropout_rates(config: "PretrainedConfig") -> dict[str, float]:
    """The config's dropout rates by name: every numeric setting whose name says dropout. The families name
    them their own way (BERT's hidden_dropout_prob and attention_probs_dropout_prob, DistilBERT's dropout,
    attention_dropout and qa_dropout, ModernBERT's embedding_, mlp_ and attention_dropout); a name with
    "attention" in it rates the attention probabilities, every other one a hidden state."""
    return {
        name: value
        for name, value in config.to_dict().items()
        if "dropout" in name and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def set_dropout(
    config: "PretrainedConfig", model_dir: PathLike, hidden: Optional[float], attention: Optional[float]
) -> None:
    """Each given rate written over the config's settings of its kind (`dropout_rates`); a UserError where the
    family has no setting of that kind, since the rate would silently change nothing."""
    for rate, attn, flag in ((hidden, False, "--dropout"), (attention, True, "--attention-dropout")):
        if rate is None:
            continue
        names = [name for name in dropout_rates(config) if ("attention" in name) == attn]
        if not names:
            raise UserError(f"{flag}: {model_dir} ({config.model_type}) has no such dropout in its config.json")
        for name in names:
            setattr(config, name, rate)


def _qa_class(config: "PretrainedConfig", model_dir: PathLike) -> type[Any]:
    """transformers' AutoModelForQuestionAnswering where it has a class for this config, else the project's
    span head on the family's encoder (AutoModel's class), and always for a model saved with that head."""
    import transformers  # heavy: not for the commands that load no model
    from transformers import AutoModelForQuestionAnswering
    from transformers.models.auto.modeling_auto import MODEL_FOR_QUESTION_ANSWERING_MAPPING, MODEL_MAPPING

    from bert_squad import span_head  # imports transformers: not for the commands that load no model

    saved = str((getattr(config, "auto_map", None) or {}).get("AutoModelForQuestionAnswering", ""))
    if not saved.startswith(f"{span_head.MODULE}.") and type(config) in MODEL_FOR_QUESTION_ANSWERING_MAPPING:
        return AutoModelForQuestionAnswering
    if type(config) in MODEL_MAPPING:
        return span_head.for_model_type(config.model_type)
    raise UserError(
        f"{model_dir}: transformers {transformers.__version__} has neither a question-answering class "
        f"nor an encoder for model type '{config.model_type}'"
    )


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Loading an encoder into a QA head is expected: no "newly initialized" warning to alarm users, and no
    torch remark on a pickle it cannot read safely, before it is refused."""
    import transformers  # heavy: not for the commands that load no model

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def _check_encoder_loaded(
    model_dir: PathLike, config: "PretrainedConfig", info: dict[str, Any], say: Optional[Callable[[str], None]]
) -> None:
    """The project's span head needs the whole encoder from the checkpoint (only the head may be new); what
    the checkpoint has beyond it (a masked-LM head) is left out, and `say` is told so, in one line."""
    missing = [k for k in info["missing_keys"] if not k.startswith("qa_outputs.")]
    if missing:
        raise UserError(
            f"{model_dir}: cannot load model weights (they lack {missing[0]} of the "
            f"{config.model_type} encoder{f' and {len(missing) - 1} more' if len(missing) > 1 else ''})"
        )
    left_out = sorted({k.split(".")[0] for k in info["unexpected_keys"]})
    if left_out and say is not None:
        n = len(info["unexpected_keys"])
        say(
            f"{model_dir}: its {config.model_type} encoder loaded into a new span head (bert-squad's, "
            f"transformers has no question-answering class for it); left out: {', '.join(left_out)} (the head "
            f"it was saved with, {n} tensor{'' if n == 1 else 's'})"
        )


def check_window(module: "PreTrainedModel", max_seq_length: int, name: PathLike) -> None:
    """A UserError unless windows of `max_seq_length` tokens fit the model `name`'s positions: the limit is the
    model's own, not its tokenizer's model_max_length (a ModernBERT or EuroBERT takes 8,192 tokens whatever
    its tokenizer says); a longer window would die in its embeddings or leave its rotary range."""
    limit, source = max_tokens(module)
    if limit is not None and max_seq_length > limit:
        raise UserError(f"--max-seq-length {max_seq_length}: {name} takes at most {limit} tokens (its {source})")


def check_micro_batch(module: "PreTrainedModel", micro: int, max_seq_length: int, memory: int, where: str) -> None:
    """A UserError where one micro batch cannot fit the device (`memory` bytes) however the step computes: the
    two hidden states a layer keeps for the backward, in fp32, are a lower bound of what a step holds."""
    from bert_squad.perf import model_shape  # imports torch: not for the commands that load no model

    _, layers, hidden = model_shape(module)
    need = 2 * 4 * micro * max_seq_length * (hidden or 1) * (layers or 1)
    if need > memory:
        raise UserError(
            f"{where}: train_micro_batch_size_per_gpu {micro} at --max-seq-length {max_seq_length} needs at least "
            f"{need / 2**30:.1f} GiB for the activations alone, more than this device's {memory / 2**30:.1f} GiB; "
            f"lower it (gradient_accumulation_steps keeps the global batch)"
        )


def max_tokens(module: "PreTrainedModel") -> tuple[Optional[int], Optional[str]]:
    """(the most tokens a window may hold, what says so): the encoder's learned position embeddings (RoBERTa's
    start after the padding index), else `max_position_embeddings` (rotary and relative positions); (None,
    None) where the config names neither."""
    import torch  # heavy: only where a model is loaded

    for name, sub in module.named_modules():
        if name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(sub, torch.nn.Embedding):
            reserved = 0 if sub.padding_idx is None else sub.padding_idx + 1
            return sub.num_embeddings - reserved, "position embeddings"
    limit = getattr(module.config, "max_position_embeddings", None)
    return (limit, "max_position_embeddings") if limit else (None, None)


def _weights_reason(err: BaseException) -> str:
    """torch's refusal of a pickle advises weights_only=False, which would run the file's code: not advice
    for a batch job, so it is said without it."""
    reason = first_line(err)
    if reason.startswith("Weights only load failed"):
        return "a PyTorch pickle that torch.load(weights_only=True) refuses"
    return reason


def gathered_state_dict(engine: "DeepSpeedEngine") -> Optional[dict[str, "torch.Tensor"]]:
    """The whole model's fp32 weights on rank 0 (None elsewhere under ZeRO-3); every rank must call it.

    Where DeepSpeed computes in 16-bit weights (an fp16 or bf16 section), its optimizer holds the fp32 master
    copy they are rounded from: those are the weights, gathered from every rank's partition under ZeRO. Under
    ZeRO-3 the module itself holds only empty stand-ins, but its buffers whole. (DeepSpeed's 16-bit wrappers
    at stage 0 keep no copy it hands out: their 16-bit weights are exported.)"""
    from deepspeed.utils import safe_get_full_fp32_param  # heavy: with the engine

    params = dict(engine.module.named_parameters(remove_duplicate=False))
    keeps = engine.global_rank == 0 or not engine.zero_optimization_partition_weights()
    state = {}
    for name, tensor in engine.module.state_dict().items():
        # None for a buffer, and where the module's own parameter is the fp32 weight (no 16-bit section)
        master = safe_get_full_fp32_param(params[name]) if name in params else None  # a collective under ZeRO
        if keeps:
            state[name] = tensor if master is None else master
    return state if keeps else None


def export(
    module: "PreTrainedModel",
    state: dict[str, "torch.Tensor"],
    tokenizer: "PreTrainedTokenizerFast",
    trained: Optional["Task"],
    out_dir: PathLike,
) -> None:
    """Write model (fp32 safetensors of `state`), tokenizer and the task it was `trained` for (where known) beside
    each other, each file replaced atomically and given the mode the umask gives (safetensors writes its file
    owner-only); with the project's span head, its modelling file too (the config's auto_map names it)."""
    out_dir = Path(out_dir)
    tmp = files.scratch(out_dir, "export", directory=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    module.save_pretrained(str(tmp), state_dict=state)
    # The config names the dtype of the weights written (fp32), where save_pretrained names the one the model
    # computed in (16 bits under DeepSpeed's fp16 or bf16 section), which from_pretrained(dtype="auto") would load.
    config = copy.deepcopy(module.config)
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", "float32")  # 5.x, 4.x
    config.save_pretrained(str(tmp))
    _write_span_head(module, tmp)
    save_tokenizer(tokenizer, tmp)
    if trained is not None:
        trained.write(tmp)
    _remove_stale(out_dir, {f.name for f in tmp.iterdir()})
    for f in tmp.iterdir():
        files.umask_mode(f)
        os.replace(f, out_dir / f.name)
    tmp.rmdir()


def _remove_stale(out_dir: Path, written: set[str]) -> None:
    """The files an export writes only for some models (the task it was trained for where known, the span head's
    modelling file), left in `out_dir` by an older export and not written by this one: they describe other
    weights, so they go before the new ones come."""
    from bert_squad import span_head  # imports transformers: not for the commands that load no model

    for name in (outputs.TASK_FILE, f"{span_head.MODULE}.py"):
        if name not in written:
            (out_dir / name).unlink(missing_ok=True)


def _write_span_head(module: "PreTrainedModel", out_dir: PathLike) -> None:
    """Beside the weights of a model with the project's span head: span_head.py and the class its config names,
    so that transformers alone loads it (`AutoModelForQuestionAnswering`, trust_remote_code=True)."""
    from bert_squad import span_head  # imports transformers: not for the commands that load no model

    if not isinstance(module, span_head.SpanHead):
        return
    source = Path(span_head.__file__).read_text()
    name = type(module).__name__
    footer = f"\n\n# The class config.json's auto_map names.\n{name} = for_model_type({module.config.model_type!r})\n"
    (Path(out_dir) / f"{span_head.MODULE}.py").write_text(source + footer)


def save_tokenizer(tokenizer: "PreTrainedTokenizerFast", out_dir: PathLike) -> None:
    """The tokenizer's files in `out_dir`, loadable under transformers 4.x and 5.x."""
    tokenizer.save_pretrained(str(out_dir))
    _portable_tokenizer_class(Path(out_dir) / "tokenizer_config.json")


def _portable_tokenizer_class(path: Path) -> None:
    """transformers 5 names a generic fast tokenizer `TokenizersBackend`, a class 4.x lacks; the 4.x
    name of the same thing loads under both lines."""
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def param_groups(module: "torch.nn.Module", weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm weights, as BERT was trained."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in module.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weights_digest(state: dict[str, "torch.Tensor"]) -> str:
    """A digest of this rank's weights: data-parallel ranks that agree end with equal digests (under
    ZeRO-3 only rank 0 holds whole weights, so there is one digest)."""
    h = hashlib.sha256()
    for _, p in sorted(state.items()):
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
