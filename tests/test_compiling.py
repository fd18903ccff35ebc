"""--compile's settings for a GPU, checked where no GPU is: the compiled training step itself runs in
tests/test_train.py on the CPU and in bench/gpu_check.py on a GPU."""

import pytest
import torch

from bert_squad import compiling


@pytest.fixture(autouse=True)
def inductor_settings():
    """Inductor's settings as a fresh process has them, and back as they were after the test (a torch whose
    inductor lacks the setting has nothing to restore)."""
    has = hasattr(torch._inductor.config.triton, "cudagraph_or_error")
    with torch._inductor.config.patch({"triton.cudagraph_or_error": False} if has else {}):
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


@pytest.mark.compat
def test_a_torch_without_what_the_gpu_step_needs_refuses_compile_on_a_gpu_only():
    """--compile on a GPU asks inductor for cudagraph_or_error, which torch 2.8 (the floor, the compat line's) lacks:
    there it is one line naming the release that has it; on a CPU, and wherever torch has it, nothing to say."""
    import torch._inductor.config

    has = hasattr(torch._inductor.config.triton, "cudagraph_or_error")
    assert compiling.unsupported("cpu") is None
    why = compiling.unsupported("cuda")
    assert (why is None) == has
    assert has or why.startswith("on a GPU it needs a torch whose inductor has triton.cudagraph_or_error (torch 2.10")
