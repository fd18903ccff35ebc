"""The run's DeepSpeed engine, built by DeepSpeed's own `deepspeed.initialize` and nothing else of its.

The optimizer and scheduler a config names are DeepSpeed's to build: how it reads their sections, which classes
and arguments it picks (torch's AdamW or its fused Adam, its CPU Adam under ZeRO offload) and what it refuses
change between releases. So the run builds the engine itself before it writes anything of its own, and whatever
`initialize` raises is one line naming the config. torch's fused and foreach kernels check their arguments only
at a step (`capturable` off a GPU, an `eps` that is a list): the optimizer built is stepped once on a parameter of
its own, a copy with the same arguments, before the run's first step.
"""

import inspect
from typing import Any

import deepspeed
import torch

from bert_squad.dsconfig import DeepSpeedConfig
from bert_squad.errors import UserError, first_line


def start(
    module: torch.nn.Module, ds_config: DeepSpeedConfig, groups: list[dict[str, Any]], device: torch.device
) -> Any:
    """`module` on DeepSpeed's engine for `ds_config`, its parameters in `groups`; a config DeepSpeed cannot build
    an engine of, or whose optimizer cannot step on `device`, is a UserError naming the file."""
    try:
        engine, _, _, _ = deepspeed.initialize(model=module, config=ds_config.for_engine(), model_parameters=groups)
    except Exception as err:  # whatever DeepSpeed, torch or an op's build raises here: the config is why
        raise UserError(f"{ds_config.path}: DeepSpeed cannot build its engine: {first_line(err)}") from err
    try:
        step_once(engine.basic_optimizer, device)
    except Exception as err:
        name = type(engine.basic_optimizer).__name__
        raise UserError(
            f"{ds_config.path}: optimizer.params are not what {name} takes on {device.type}: {first_line(err)}"
        ) from err
    return engine


def step_once(optimizer: Any, device: torch.device) -> None:
    """One step of a torch.optim optimizer's copy (its class and constructor arguments) on a parameter of its own
    on `device`, a zero gradient: torch checks a fused or foreach kernel's arguments only then. DeepSpeed's own
    optimizers (its fused Adam, its CPU Adam) check theirs when built."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not type(optimizer).__module__.startswith("torch.optim"):
        return
    takes = inspect.signature(type(optimizer)).parameters  # `defaults` may hold what a subclass fixes (AdamW's)
    param = torch.nn.Parameter(torch.zeros(1, device=device))
    param.grad = torch.zeros_like(param)
    type(optimizer)([param], **{k: v for k, v in optimizer.defaults.items() if k in takes}).step()
