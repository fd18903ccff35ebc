"""The checkpoint's files, read back without a training run (tests/test_resume.py stops and resumes runs)."""

import random

import numpy as np
import torch

from bert_squad.checkpoint import _rng_state, _set_rng_state


def test_rng_state_loads_without_unpickling(tmp_path):
    """The per-rank RNG file holds tensors and plain values only: torch.load(weights_only=True) reads it."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    torch.save(_rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    _set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
