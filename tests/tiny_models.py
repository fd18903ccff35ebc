"""Tiny, randomly initialised question-answering models of the encoder families the project supports.

`build_tiny_model(family, out_dir)` writes a directory that loads offline with `AutoTokenizer` (fast)
and `AutoModelForQuestionAnswering` under transformers 4.x and 5.x: a 2-layer model with hidden size 32
(seeded) and a tokenizer trained here, with the `tokenizers` library, on the texts of the shipped
sample. Each tokenizer has the kind of pipeline the family's real checkpoints use, since that is
what decides whether answer offsets come out right:

- bert, distilbert, electra: uncased WordPiece (BertNormalizer + BertPreTokenizer), [CLS] A [SEP] B [SEP];
- roberta: byte-level BPE without a prefix space, offsets trimmed of the space (RobertaProcessing),
  <s> A </s></s> B </s>;
- modernbert: byte-level BPE (NFC, no prefix space, offsets trimmed), [CLS] A [SEP] B [SEP], no
  token_type_ids;
- deberta-v3: SentencePiece-style Unigram with Metaspace ("▁", prepended always), NFKC, [CLS] A [SEP] B [SEP];
- xlm-roberta: the same Unigram pipeline, <s> A </s></s> B </s> (type ids all 0), RoBERTa's positions;
- mdeberta-v3: deberta-v3's. The multilingual families' tokenizers (these two and EuroBERT's) also learn a
  sentence in each other language MLQA scores;
- eurobert: byte-level BPE (no prefix space) with begin/end-of-text tokens, <|begin_of_text|> A <|end_of_text|>
  B <|end_of_text|>, offsets untrimmed (their leading space kept), no token_type_ids; the padding token is the
  end-of-text token, as in EuroBERT's hub config. Saved as EuroBERT's hub checkpoints are: an encoder with a
  masked-LM head (`EuroBertForMaskedLM`), since transformers has no question-answering class for it.

ModernBERT and EuroBERT have 8,192 positions, as their hub checkpoints; the others 512.
"""

import json
from pathlib import Path

FAMILIES = (
    "bert",
    "distilbert",
    "roberta",
    "electra",
    "deberta-v3",
    "modernbert",
    "xlm-roberta",
    "mdeberta-v3",
    "eurobert",
)
# A few sentences in the other languages MLQA scores, written for these tests, for the multilingual tokenizers.
OTHER_LANGUAGES = [
    "Ada Novak wurde 1834 in Lugano geboren und studierte Physik an der Universität.",
    "Ada Novak nació en Lugano en 1834 y estudió física en la universidad.",
    "ولدت آدا نوفاك في لوغانو عام 1834 ودرست الفيزياء في الجامعة.",
    "阿达·诺瓦克于1834年出生在卢加诺，并在大学学习物理。",
    "Ada Novak sinh năm 1834 tại Lugano và học vật lý ở trường đại học.",
    "एडा नोवाक का जन्म 1834 में लुगानो में हुआ था और उन्होंने विश्वविद्यालय में भौतिकी पढ़ी।",
]
VOCAB_SIZE = 1000
# The special tokens of BERT's vocabularies and of RoBERTa's, as their tokenizer classes take them.
BERT_SPECIALS = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
ROBERTA_SPECIALS = dict(
    bos_token="<s>",
    eos_token="</s>",
    unk_token="<unk>",
    sep_token="</s>",
    cls_token="<s>",
    pad_token="<pad>",
    mask_token="<mask>",
)
HIDDEN, LAYERS, HEADS = 32, 2, 2


def sample_texts():
    from helpers import sample_path

    texts = []
    for name in ("train-v1.1.json", "dev-v1.1.json", "dev-v2.0.json"):
        for article in json.loads(sample_path(name).read_text())["data"]:
            for para in article["paragraphs"]:
                texts.append(para["context"])
                texts.extend(qa["question"] for qa in para["qas"])
    return texts


# --- tokenizers ---------------------------------------------------------------------------------


def _wordpiece(texts):
    """Uncased WordPiece over the texts' own words, and their characters alone and as a word's continuation
    (##c): built, not trained, so every build gives the same ids (the trainer breaks ties between equally
    frequent merges in another order each run, and the tests' trajectories with them)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = sorted({w for text in texts for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))})
    chars = sorted({c for w in words for c in w})
    tokens = dict.fromkeys([*specials, *chars, *(f"##{c}" for c in chars), *words])
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre, decoders.WordPiece()
    tok.post_processor = _bert_pair(tok)
    return tok, BERT_SPECIALS


def _bert_pair(tok, type_ids=True):
    """BERT's template, [CLS] A [SEP] B [SEP]; the second sequence's tokens typed 1 unless `type_ids` is off."""
    from tokenizers import processors

    second = "$B:1 [SEP]:1" if type_ids else "$B [SEP]"
    specials = [("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))]
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair=f"[CLS] $A [SEP] {second}", special_tokens=specials
    )


def _byte_level_bpe(texts, specials, normalizer=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tok


def _roberta(texts):
    from tokenizers import processors

    tok = _byte_level_bpe(texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.post_processor = processors.RobertaProcessing(  # (sep, cls) positional: tokenizers 0.23 has no keywords
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True, add_prefix_space=False
    )
    return tok, dict(ROBERTA_SPECIALS, add_prefix_space=False, trim_offsets=True)


def _modernbert(texts):
    from tokenizers import normalizers, processors

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok = _byte_level_bpe(texts, specials, normalizers.NFC())
    # ByteLevel trims the leading space off each token's offsets (TemplateProcessing does not). After the
    # template it would lose the sequence ids; before it, as here, the first token of each overflow window
    # keeps its space (tokenizers 0.22/0.23), so code that labels spans must not rely on trimmed offsets.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=True),
            _bert_pair(tok, type_ids=False),
        ]
    )
    return tok, dict(BERT_SPECIALS, model_input_names=["input_ids", "attention_mask"])


def _eurobert(texts: list) -> tuple:
    from tokenizers import processors

    begin, end, mask = "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"
    tok = _byte_level_bpe(texts, [begin, end, mask])
    specials = [(begin, tok.token_to_id(begin)), (end, tok.token_to_id(end))]
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{begin} $A {end}", pair=f"{begin} $A {end} $B {end}", special_tokens=specials
            ),
        ]
    )
    return tok, dict(
        bos_token=begin,
        eos_token=end,
        pad_token=end,
        mask_token=mask,
        model_input_names=["input_ids", "attention_mask"],
    )


def _unigram(texts, specials, unk):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [normalizers.Strip(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, unk_token=unk)
    )
    return tok


def _deberta_v3(texts):
    tok = _unigram(texts, ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], "[UNK]")
    tok.post_processor = _bert_pair(tok)
    return tok, dict(BERT_SPECIALS, do_lower_case=False, split_by_punct=False)


def _xlm_roberta(texts):
    """xlm-roberta-base's pipeline: SentencePiece Unigram, <s> A </s></s> B </s> with type ids all 0."""
    from tokenizers import processors

    tok = _unigram(texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<unk>")
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return tok, ROBERTA_SPECIALS


# family -> (tokenizer builder, transformers tokenizer class, model config class, QA model class)
_SPECS = {
    "bert": (_wordpiece, "BertTokenizerFast", "BertConfig", "BertForQuestionAnswering"),
    "distilbert": (_wordpiece, "DistilBertTokenizerFast", "DistilBertConfig", "DistilBertForQuestionAnswering"),
    "electra": (_wordpiece, "ElectraTokenizerFast", "ElectraConfig", "ElectraForQuestionAnswering"),
    "roberta": (_roberta, "RobertaTokenizerFast", "RobertaConfig", "RobertaForQuestionAnswering"),
    "modernbert": (_modernbert, "PreTrainedTokenizerFast", "ModernBertConfig", "ModernBertForQuestionAnswering"),
    "deberta-v3": (_deberta_v3, "DebertaV2TokenizerFast", "DebertaV2Config", "DebertaV2ForQuestionAnswering"),
    "xlm-roberta": (_xlm_roberta, "XLMRobertaTokenizerFast", "XLMRobertaConfig", "XLMRobertaForQuestionAnswering"),
    "mdeberta-v3": (_deberta_v3, "DebertaV2TokenizerFast", "DebertaV2Config", "DebertaV2ForQuestionAnswering"),
    "eurobert": (_eurobert, "PreTrainedTokenizerFast", "EuroBertConfig", "EuroBertForMaskedLM"),
}
LONG = ("modernbert", "eurobert")  # 8,192 positions
MULTILINGUAL = ("xlm-roberta", "mdeberta-v3", "eurobert")  # their tokenizers also learn the texts below


def _config_kwargs(family, tokenizer):
    ids = {
        name: tokenizer.convert_tokens_to_ids(getattr(tokenizer, name))
        for name in ("pad_token", "cls_token", "sep_token", "bos_token", "eos_token", "mask_token")
        if getattr(tokenizer, name) is not None
    }
    common = dict(vocab_size=len(tokenizer), pad_token_id=ids["pad_token"])
    if family == "distilbert":
        return dict(
            common, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=HIDDEN * 2, max_position_embeddings=512
        )
    bert_like = dict(
        common, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=HIDDEN * 2
    )
    if family == "bert":
        return dict(bert_like, max_position_embeddings=512)
    if family == "electra":
        return dict(bert_like, embedding_size=HIDDEN, max_position_embeddings=512)
    if family in ("roberta", "xlm-roberta"):  # positions start after the padding index, as in roberta-base
        return dict(
            bert_like,
            max_position_embeddings=514,
            type_vocab_size=1,
            bos_token_id=ids["cls_token"],
            eos_token_id=ids["sep_token"],
        )
    if family in ("deberta-v3", "mdeberta-v3"):  # deberta-v3-base's attention settings, scaled down
        return dict(
            bert_like,
            max_position_embeddings=512,
            relative_attention=True,
            position_buckets=256,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            max_relative_positions=-1,
            type_vocab_size=0,
        )
    if family == "eurobert":
        return dict(
            bert_like,
            max_position_embeddings=8192,
            bos_token_id=ids["bos_token"],
            eos_token_id=ids["eos_token"],
            mask_token_id=ids["mask_token"],
        )
    if family == "modernbert":
        return dict(
            bert_like,
            max_position_embeddings=8192,
            local_attention=64,
            global_attn_every_n_layers=2,
            cls_token_id=ids["cls_token"],
            sep_token_id=ids["sep_token"],
            bos_token_id=ids["cls_token"],
            eos_token_id=ids["sep_token"],
        )
    raise ValueError(family)


def build_tiny_model(family, out_dir, seed=0):
    """Write a tiny `family` QA model and its fast tokenizer (trained offline on the sample) to `out_dir`."""
    import torch
    import transformers

    if family not in _SPECS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    build_tok, tok_cls, config_cls, model_cls = _SPECS[family]
    backend, kwargs = build_tok(sample_texts() + (OTHER_LANGUAGES if family in MULTILINGUAL else []))
    tokenizer = getattr(transformers, tok_cls)(tokenizer_object=backend, **kwargs)
    tokenizer.model_max_length = 8192 if family in LONG else 512
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    if tok_cls == "PreTrainedTokenizerFast":
        # transformers 5 records its generic class as "TokenizersBackend", which 4.x cannot load; the
        # name real checkpoints (ModernBERT) carry loads in both.
        config_file = out_dir / "tokenizer_config.json"
        tok_config = json.loads(config_file.read_text())
        tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    config = getattr(transformers, config_cls)(**_config_kwargs(family, tokenizer))
    torch.manual_seed(seed)
    getattr(transformers, model_cls)(config).save_pretrained(str(out_dir))
    return out_dir


def break_tokenizer(model_dir, out_dir, how):
    """A copy of `model_dir` whose tokenizer is broken as a user's download or conversion can leave it:
    "empty vocabulary" keeps only the special tokens of its BPE (every piece of text is then dropped), "no
    second sequence" makes its template's pair the first sequence twice (the context is never marked)."""
    import shutil

    out_dir = Path(out_dir)
    shutil.copytree(model_dir, out_dir)
    spec = json.loads((out_dir / "tokenizer.json").read_text())
    if how == "empty vocabulary":
        spec["model"]["vocab"] = {
            k: v for k, v in spec["model"]["vocab"].items() if k in {t["content"] for t in spec["added_tokens"]}
        }
        spec["model"]["merges"] = []
    elif how == "no second sequence":
        first = {"Sequence": {"id": "A", "type_id": 0}}
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [first],
            "pair": [first, first],
            "special_tokens": {},
        }
    else:
        raise ValueError(how)
    (out_dir / "tokenizer.json").write_text(json.dumps(spec))
    return out_dir


if __name__ == "__main__":  # python tests/tiny_models.py FAMILY OUT_DIR
    import sys

    print(build_tiny_model(sys.argv[1], sys.argv[2]))
