"""--dropout and --attention-dropout: which settings of each family's config they replace, what the loaded model
then drops, and the attention kernel a rate leaves SDPA on a CPU."""

import pytest
import torch
import transformers

from bert_squad import model
from bert_squad.errors import UserError

# Each family's config class, and the names its rates have (transformers' own configs are the oracle).
FAMILIES = {
    "BertConfig": ({"hidden_dropout_prob", "classifier_dropout"}, {"attention_probs_dropout_prob"}),
    "DistilBertConfig": ({"dropout", "qa_dropout", "seq_classif_dropout"}, {"attention_dropout"}),
    "DebertaV2Config": ({"hidden_dropout_prob", "pooler_dropout"}, {"attention_probs_dropout_prob"}),
    "ModernBertConfig": ({"embedding_dropout", "mlp_dropout", "classifier_dropout"}, {"attention_dropout"}),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_rate_replaces_the_settings_of_its_kind(name):
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    config = cls(classifier_dropout=0.3) if "classifier_dropout" in FAMILIES[name][0] else cls()
    hidden, attention = FAMILIES[name]
    model.set_dropout(config, "m", 0.25, 0.0)
    rates = model.dropout_rates(config)
    assert {k for k, v in rates.items() if v == 0.25} == hidden and {
        k for k, v in rates.items() if v == 0.0
    } == attention


def test_a_rate_the_family_has_no_setting_for_is_refused():
    config = transformers.BertConfig()
    for name in model.dropout_rates(config):
        delattr(config, name)
    with pytest.raises(UserError, match=r"--dropout: m \(bert\) has no such dropout in its config.json"):
        model.set_dropout(config, "m", 0.1, None)
    model.set_dropout(config, "m", None, None)  # nothing asked, nothing refused


def _attention_kernels(module):
    ids = torch.randint(5, 50, (2, 24))
    with torch.profiler.profile() as prof:
        module(input_ids=ids, attention_mask=torch.ones_like(ids))
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


def test_the_loaded_model_drops_at_the_given_rates_and_sdpa_keeps_its_fused_cpu_kernel_at_0(tiny_model):
    module = model.load_qa_model(tiny_model, dropout=0.2, attention_dropout=0.0).train()
    assert module.config.hidden_dropout_prob == 0.2 and module.config.attention_probs_dropout_prob == 0.0
    assert {m.p for m in module.modules() if isinstance(m, torch.nn.Dropout)} <= {0.2, 0.0}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in _attention_kernels(module)
    dropping = model.load_qa_model(tiny_model, attention_dropout=0.1).train()
    assert "aten::_scaled_dot_product_attention_math" in _attention_kernels(dropping)
