"""Model and tokenizer: loaded from a local directory (`cache.find_model` resolves hub names to one), never
from the network; exported in Hugging Face format so `AutoModelForQuestionAnswering` (transformers 4
and 5) and `bert_squad.answer.Answerer` load it.
"""

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

from bert_squad.errors import UserError


def _reason(err):
    """The first line of a library's error: enough to say what is wrong without a traceback."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _check_model_type(model_dir):
    """A family newer than the installed transformers (ModernBERT before 4.48) fails in its tokenizer with a
    message about the tokenizer file, or in its config with a paragraph: name the real cause, in one line."""
    import transformers  # heavy: not for the commands that load no model
    from transformers import CONFIG_MAPPING

    try:
        model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # no readable config: the loaders say what is wrong with the directory
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING:
        raise UserError(f"{model_dir}: model type '{model_type}' is unknown to transformers "
                        f"{transformers.__version__}: a newer transformers has it (docs/models.md)")


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer  # heavy: not for the commands that load no model

    _check_model_type(model_dir)
    # Any failure to read a user's directory (missing files, a slow-only tokenizer needing protobuf or
    # sentencepiece, malformed JSON) is a problem with that directory, said in one line.
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:
        raise UserError(f"{model_dir}: cannot load a tokenizer ({_reason(err)})") from None
    # transformers 5 builds an empty vocabulary where no tokenizer file exists; every word would be [UNK].
    if not any((Path(model_dir) / name).is_file() for name in tok.vocab_files_names.values()):
        raise UserError(f"{model_dir}: cannot load a tokenizer (none of its files: "
                        f"{', '.join(sorted(tok.vocab_files_names.values()))})")
    if not tok.is_fast:
        raise UserError(f"{model_dir}: needs a fast tokenizer (tokenizer.json) for offset mappings")
    return tok


def load_qa_model(model_dir):
    """A question-answering model; an encoder checkpoint gets a new span head (that is fine-tuning).

    transformers picks SDPA attention by itself where the family has it (DeBERTa has not)."""
    import transformers  # heavy: not for the commands that load no model
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    _check_model_type(model_dir)
    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:
        raise UserError(f"{model_dir}: not a model directory ({_reason(err)})") from None
    # Loading an encoder into a QA head is expected; don't alarm users with the "newly initialized" warning.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():  # torch's remark on a pickle it cannot read safely, before refusing it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return AutoModelForQuestionAnswering.from_pretrained(str(model_dir), config=config, local_files_only=True)
    except Exception as err:  # truncated or foreign weights, an architecture without a QA head, ...
        raise UserError(f"{model_dir}: cannot load model weights ({_weights_reason(err)})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def _weights_reason(err):
    """torch's refusal of a pickle advises weights_only=False, which would run the file's code: not advice
    for a batch job, so it is said without it."""
    reason = _reason(err)
    if reason.startswith("Weights only load failed"):
        return "a PyTorch pickle that torch.load(weights_only=True) refuses"
    return reason


def gathered_state_dict(engine):
    """The whole model's weights on rank 0 (None elsewhere under ZeRO-3); every rank must call it.

    Under ZeRO-3 each rank holds a slice of every parameter and `state_dict()` returns empty tensors;
    DeepSpeed gathers them layer by layer onto rank 0 (whatever stage3_gather_16bit_weights_on_model_save
    says: the export always needs them)."""
    if engine.zero_optimization_partition_weights():
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.state_dict()


def export(module, state, tokenizer, out_dir):
    """Write model (fp32 safetensors of `state`) and tokenizer beside each other, each file replaced atomically."""
    out_dir = Path(out_dir)
    tmp = out_dir / f".export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    module.save_pretrained(str(tmp), state_dict=state)
    save_tokenizer(tokenizer, tmp)
    for f in tmp.iterdir():
        os.replace(f, out_dir / f.name)
    tmp.rmdir()


def save_tokenizer(tokenizer, out_dir):
    """The tokenizer's files in `out_dir`, loadable under transformers 4.x and 5.x."""
    tokenizer.save_pretrained(str(out_dir))
    _portable_tokenizer_class(Path(out_dir) / "tokenizer_config.json")


def _portable_tokenizer_class(path):
    """transformers 5 names a generic fast tokenizer `TokenizersBackend`, a class 4.x lacks; the 4.x
    name of the same thing loads under both lines."""
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def param_groups(module, weight_decay):
    """No weight decay on biases and LayerNorm weights, as BERT was trained."""
    decay, no_decay = [], []
    for p in module.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weights_digest(state):
    """A digest of this rank's weights: data-parallel ranks that agree end with equal digests (under
    ZeRO-3 only rank 0 holds whole weights, so there is one digest)."""
    h = hashlib.sha256()
    for _, p in sorted(state.items()):
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
