"""Fine-tune BERT-family encoders for extractive question answering on SQuAD with DeepSpeed."""

__version__ = "0.1.0"
