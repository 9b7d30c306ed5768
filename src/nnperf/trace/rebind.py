"""Move or cast a model's tensors by rebinding them, not by ``Module.to``.

``Module.to`` swaps tensor subclasses in place (``torch.utils.swap_tensors``), which fake
tensors refuse while a fake mode holds weak references to them ("Cannot swap ... weakref"):
tracing with ``--dtype`` and PyTorch's RuntimeEstimator (a fake-tensor step on a CUDA device)
both hit it. Rebinding each parameter and buffer to a converted copy works for real and fake
tensors alike; a memo keeps tied weights (GPT-2's lm_head and wte) tied.
"""

from __future__ import annotations

import torch
from torch import nn


def rebind_tensors(model: nn.Module, *, device: torch.device | None = None,
                   dtype: torch.dtype | None = None,
                   memory_format: torch.memory_format | None = None) -> nn.Module:
    """``model`` with every parameter and buffer on ``device`` and, if floating point, in
    ``dtype``; 4-D ones in ``memory_format`` (as ``Module.to(memory_format=...)`` converts
    them). Any may be None: unchanged. Tensors already there are kept as they are."""
    converted: dict[int, nn.Parameter] = {}

    def reformat(t: torch.Tensor) -> bool:
        return memory_format is not None and t.dim() == 4 and not t.is_contiguous(memory_format=memory_format)

    def convert(t: torch.Tensor) -> torch.Tensor:
        target = dtype if dtype is not None and t.is_floating_point() else t.dtype
        out = t.detach().to(device=device or t.device, dtype=target)
        return out.contiguous(memory_format=memory_format) if reformat(out) else out

    def unchanged(t: torch.Tensor) -> bool:
        same_device = device is None or t.device == device
        same_dtype = dtype is None or not t.is_floating_point() or t.dtype == dtype
        return same_device and same_dtype and not reformat(t)

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is None or unchanged(p):
                continue
            if id(p) not in converted:
                converted[id(p)] = nn.Parameter(convert(p), p.requires_grad)
            module._parameters[name] = converted[id(p)]
        for name, b in module._buffers.items():
            if b is not None and not unchanged(b):
                module._buffers[name] = convert(b)
    return model
