"""The project's span head (bert_squad/span_head.py) held to an independent oracle: transformers' own
BertForQuestionAnswering, whose head it is. Given the same weights, the two must compute the same logits and the
same loss, positions outside the window included."""

import torch
from transformers import AutoTokenizer, BertForQuestionAnswering

from bert_squad import span_head

QUESTIONS = ["Where was Ada Novak born?", "When was she born?"]
CONTEXTS = ["Ada Novak was born in Lugano in 1834.", "Ada Novak was born in Lugano in 1834. She studied physics."]


def test_bert_weights_in_the_span_head_give_bert_for_question_answering_s_logits_and_loss(tiny_model):
    reference = BertForQuestionAnswering.from_pretrained(tiny_model).eval()
    ours = span_head.for_model_type("bert")(reference.config).eval()
    loaded = ours.load_state_dict(reference.state_dict(), strict=False)
    # Everything but the encoder's pooler, which BertForQuestionAnswering leaves out and no span reads.
    assert loaded.unexpected_keys == [] and {k.split(".")[1] for k in loaded.missing_keys} == {"pooler"}, loaded
    batch = AutoTokenizer.from_pretrained(tiny_model)(QUESTIONS, CONTEXTS, padding=True, return_tensors="pt")
    window = batch["input_ids"].shape[1]
    # The second answer ends past the window: both ignore that end in the loss (clamped to the window's length).
    positions = {"start_positions": torch.tensor([9, 12]), "end_positions": torch.tensor([10, window + 7])}
    with torch.no_grad():
        want, got = reference(**batch, **positions), ours(**batch, **positions)
    assert torch.equal(got.start_logits, want.start_logits) and torch.equal(got.end_logits, want.end_logits)
    assert torch.equal(got.loss, want.loss) and want.loss.item() > 0
    assert want.start_logits.std() > 0  # the head's weights are not all alike: the comparison could fail
