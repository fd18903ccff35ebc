"""--compile: the training step's forward and backward compiled whole, one graph per length bucket, each built at
its bucket's first step and replayed from then on; on a GPU as CUDA graphs, so the host issues one launch a graph.

Shapes are static (`dynamic=False`): training feeds at most 8 (`batching.bucket_lengths`), within dynamo's
recompile limit, and a CUDA graph is recorded per shape whatever the graph. A graph break is an error
(`fullgraph=True`), and on a GPU so is a graph the compiler would leave out of CUDA graphs (inductor's
`cudagraph_or_error`): either would put the host back into the step. Evaluation runs the same module eagerly
(torch.compiler's "force_eager" stance, in `train.evaluate_now`), so it neither compiles graphs of its own nor
displaces training's.
"""

from __future__ import annotations

from typing import Any

import torch


def options(device_type: str) -> dict[str, Any]:
    """torch.compile's arguments for training on a `device_type` device: whole, static graphs; CUDA graphs on a
    GPU (`reduce-overhead`; ROCm's devices are "cuda" to torch too)."""
    return dict(fullgraph=True, dynamic=False, **({"mode": "reduce-overhead"} if device_type == "cuda" else {}))


def unsupported(device_type: str) -> str | None:
    """Why this torch cannot compile the training step as --compile does on a `device_type` device (None: it
    can): on a GPU it needs inductor's `cudagraph_or_error`, which torch 2.8 lacks and 2.10 has."""
    if device_type == "cuda" and not hasattr(torch._inductor.config.triton, "cudagraph_or_error"):
        return (
            f"on a GPU it needs a torch whose inductor has triton.cudagraph_or_error (torch 2.10 has it; this is "
            f"{torch.__version__}), which keeps every graph in CUDA graphs; train without --compile"
        )
    return None


def compile_model(module: torch.nn.Module, device_type: str) -> None:
    """Compile the model's forward (and with it, through AOTAutograd, its backward) for training on a
    `device_type` device, in place. The forward alone, not the module's call as DeepSpeed's `engine.compile()`
    does: the engine's forward hooks read its step counter, which a graph would guard on and recompile for at
    every step."""
    if device_type == "cuda":
        torch._inductor.config.triton.cudagraph_or_error = True
    module.forward = torch.compile(module.forward, **options(device_type))


def stats() -> dict[str, Any]:
    """What compiling cost this process so far: graphs built (one a shape), graph breaks, graphs left out of
    CUDA graphs, and seconds spent compiling (dynamo, AOTAutograd and inductor, forward and backward)."""
    from torch._dynamo.utils import calculate_time_spent, counters  # the compiler's own: only for runs that compile

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "seconds": calculate_time_spent().get("total_wall_time", 0.0),
    }
