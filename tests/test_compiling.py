"""--compile's settings for a GPU, checked where no GPU is: the compiled training step itself runs in
tests/test_train.py on the CPU and in bench/gpu_check.py on a GPU."""

import pytest
import torch

from bert_squad import compiling


@pytest.fixture(autouse=True)
def inductor_settings():
    """Inductor's settings as a fresh process has them, and back as they were after the test."""
    with torch._inductor.config.patch({"triton.cudagraph_or_error": False}):
        yield


def test_a_gpu_step_is_recorded_as_cuda_graphs_and_a_graph_left_out_of_them_is_an_error():
    module = torch.nn.Linear(2, 2)
    compiling.compile_model(module, "cuda")
    assert torch._inductor.config.triton.cudagraph_or_error
    assert compiling.options("cuda") == dict(fullgraph=True, dynamic=False, mode="reduce-overhead")
    assert "forward" in vars(module)  # compiled in place: the module runs the compiled forward


def test_a_cpu_step_is_compiled_whole_and_static_without_cuda_graphs():
    compiling.compile_model(torch.nn.Linear(2, 2), "cpu")
    assert not torch._inductor.config.triton.cudagraph_or_error
    assert compiling.options("cpu") == dict(fullgraph=True, dynamic=False)
