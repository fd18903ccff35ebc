"""A start/end span head on an encoder that transformers ships without a question-answering class
(EuroBERT: `EuroBertModel`, no `EuroBertForQuestionAnswering`).

The head is BERT's `qa_outputs`: one linear layer from the encoder's last hidden states to a start and
an end logit per token, initialised N(0, initializer_range) with a zero bias, trained with the mean of
the start and end cross-entropies. The class is built per encoder family (`for_model_type`) on the
family's own `PreTrainedModel` base, as transformers builds its own question-answering classes: the
encoder sits under the family's `base_model_prefix`, so a checkpoint saved with a masked-LM head loads
its encoder weights and leaves the LM head out, and the family's config class, attention support and
weight initialisation carry over.

This file needs only torch and transformers: bert-squad writes it beside the weights of every model it
saves with this head (as `MODULE`.py, with the class its config names), so that

    AutoModelForQuestionAnswering.from_pretrained(model_dir, trust_remote_code=True)

loads the model with transformers alone.
"""

from functools import cache
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn
from transformers import CONFIG_MAPPING, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import QuestionAnsweringModelOutput
from transformers.models.auto.modeling_auto import MODEL_MAPPING

MODULE = "modeling_bert_squad"  # the file's name beside the weights, as the config's auto_map names it
if TYPE_CHECKING:  # to a type checker, the mixin's base is the PreTrainedModel it is mixed into (for_model_type)

    class _Mixin(PreTrainedModel):
        pass
else:
    _Mixin = object


class SpanHead(_Mixin):
    """The span head and its loss; mixed into the encoder family's `PreTrainedModel` by `for_model_type`."""

    encoder_class: Any = None  # the family's encoder (AutoModel's class for its config), set by for_model_type

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.encoder_class(config))
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        # What a saved copy needs to load with transformers alone (the file is written beside the weights).
        config.auto_map = {"AutoModelForQuestionAnswering": f"{MODULE}.{type(self).__name__}"}
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        head = getattr(self, "qa_outputs", None)  # absent while the encoder is built
        if head is not None and module is head:  # BERT's qa_outputs initialisation
            nn.init.normal_(head.weight, mean=0.0, std=self.config.initializer_range)
            nn.init.zeros_(head.bias)
        else:
            super()._init_weights(module)

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        start_positions: Optional[torch.Tensor] = None,
        end_positions: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> QuestionAnsweringModelOutput:
        """Start and end logits per token; with positions, the loss BERT's question-answering head has
        (positions outside the window are ignored)."""
        hidden = self.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
        start, end = self.qa_outputs(hidden).split(1, dim=-1)
        start, end = start.squeeze(-1).contiguous(), end.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start.size(1)
            ce = nn.CrossEntropyLoss(ignore_index=ignored)
            loss = (ce(start, start_positions.clamp(0, ignored)) + ce(end, end_positions.clamp(0, ignored))) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end)


@cache
def for_model_type(model_type: str) -> type:
    """The span-head model of encoders of `model_type`, named as transformers names its own classes
    (`EuroBertForQuestionAnswering`) and built like them on the family's `PreTrainedModel`."""
    config_class = CONFIG_MAPPING[model_type]
    encoder_class = MODEL_MAPPING[config_class]
    family_base = next(c for c in encoder_class.__mro__[1:] if issubclass(c, PreTrainedModel))
    name = config_class.__name__[: -len("Config")] + "ForQuestionAnswering"
    return type(
        name,
        (SpanHead, family_base),
        {
            "__module__": __name__,
            "encoder_class": encoder_class,
            "__doc__": f"{encoder_class.__name__} with a start/end span head.",
        },
    )
