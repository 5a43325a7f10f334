"""PyTorch ``state_dict`` <-> ``Model.params`` without copies where the memory allows it.

A CPU, contiguous tensor and its numpy array share one buffer (``Tensor.numpy()`` and
``torch.from_numpy``), so converting a model of any size costs nothing. A copy happens only
where it must: a tensor on a GPU (moved to the CPU) or a non-contiguous one. bfloat16, which
numpy cannot represent, is shared as its raw words (``atoll.fl.bfloat16.BF16``, no copy): it
travels and is stored as bf16, and comes back as a torch.bfloat16 tensor.

``distributed(module)`` wraps a module for a site that trains with several processes (DDP).

With ``fl/distributed.py`` (lazily, for several ranks), this is the only atoll module that
imports torch: training scripts and the demo use it, the parents never do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from atoll.fl import bfloat16


def to_params(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A state_dict (or a module) as numpy arrays that share memory with the tensors if possible.

    The arrays alias the module's live weights: encode or copy them before training further.
    ``fl.send()`` serializes right away, so the usual script is safe.
    """
    if isinstance(state_dict, torch.nn.parallel.DistributedDataParallel):
        state_dict = state_dict.module  # its own names, without DDP's "module." prefix
    if isinstance(state_dict, torch.nn.Module):
        state_dict = state_dict.state_dict()
    params: dict[str, np.ndarray] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        if tensor.dtype == torch.bfloat16:  # its 16-bit words, tagged: the same buffer
            params[name] = bfloat16.from_words(tensor.view(torch.int16).numpy())
        else:
            params[name] = tensor.numpy()
    return params


def to_state_dict(params: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Model params as CPU tensors sharing memory with the arrays (read-only arrays are copied)."""
    out: dict[str, torch.Tensor] = {}
    for name, array in params.items():
        if not isinstance(array, np.ndarray):
            raise TypeError(f"params[{name!r}] is a {type(array).__name__}, not a numpy array")
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, order="C")  # torch.from_numpy needs a writable buffer
        if bfloat16.is_bf16(array.dtype):
            out[name] = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(array)
    return out


def load_params(module: torch.nn.Module, params: Mapping[str, np.ndarray], strict: bool = True):
    """Copy params into a module's own tensors (on its device, in its dtypes)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    return module.load_state_dict(to_state_dict(params), strict=strict)


def device() -> torch.device:
    """This rank's device: its one GPU (the launcher shows each rank one) or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    return torch.device("cuda", 0 if len(visible) == 1 else int(os.environ.get("LOCAL_RANK", 0)))


def distributed(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` on this rank's device, wrapped in DistributedDataParallel when the site trains
    with several processes (after ``fl.init()``, which joins the process group); the module
    itself otherwise, so one script runs in the simulator and on one or many GPUs.
    ``to_params`` and ``load_params`` accept either."""
    import torch.distributed as dist

    where = device()
    module = module.to(where)
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return module
    ids = [where.index] if where.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)
