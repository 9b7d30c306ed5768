"""The aten ops a real step runs on a device, beside the ops nnperf's trace records for it.

The trace is taken on the CPU's dispatch path (meta or fake tensors), and where CUDA runs other
ops the tracer substitutes them (``trace.attention``, ``trace.rnn``, ``trace.autocast_cuda``,
CUDA's fused dropout). This module checks those substitutions against what a device really
ran: ``record_ops`` counts every aten op of one real step (a dispatch mode, so the ops are
the ones the device's kernels were called for), ``compare`` lines the counts up with a trace's.

A difference is either one of ``SAME_WORK`` (the trace's stand-in for a device op, or the
device's name for the same kernel) or a finding. ``NOT_KERNELS`` are ops that launch no
device kernel whichever path runs them (views, metadata, host scalars): they are left out of
both counts, because the CPU and CUDA paths create views differently (``matmul`` folds batch
dimensions with views on one and copies on the other) without any cost difference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nnperf.trace.events import Trace

#: trace op -> the device ops that do its work (each one counts as one trace op)
SAME_WORK: dict[str, frozenset[str]] = {
    "nnperf.attention": frozenset({
        "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    }),
    "nnperf.attention_backward": frozenset({
        "aten._scaled_dot_product_flash_attention_backward",
        "aten._scaled_dot_product_efficient_attention_backward",
        "aten._scaled_dot_product_cudnn_attention_backward",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    }),
    "nnperf.cudnn_rnn": frozenset({"aten._cudnn_rnn"}),
    "nnperf.cudnn_rnn_backward": frozenset({"aten._cudnn_rnn_backward"}),
    # fp32 NCHW batch norm runs cuDNN's kernels on a GPU; the cost table prices both alike
    "aten.native_batch_norm": frozenset({"aten.cudnn_batch_norm"}),
    "aten.native_batch_norm_backward": frozenset({"aten.cudnn_batch_norm_backward"}),
    # the engine's gradient sums (trace/accumulation.py) are in place in a plain step, and the
    # trace folds them so; under ``record_ops``' dispatch mode every tensor passes through
    # Python, the engine no longer holds the only reference, and it sums out of place: one
    # kernel moving the same bytes. Seen on the H200 (2026-11-28) and checked on a CPU, where
    # the profiler (no Python mode) counts resnet18's 8 backward residual sums as add_.
    "aten.add_": frozenset({"aten.add"}),
}
#: Ops that launch no kernel on any device: views, metadata, host-side scalars.
NOT_KERNELS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.transpose", "aten.t",
    "aten.permute", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.split",
    "aten.split_with_sizes", "aten.unbind", "aten.as_strided", "aten.alias", "aten.detach",
    "aten.lift_fresh", "aten.lift_fresh_copy", "aten._local_scalar_dense", "aten.is_same_size",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset",
    "aten.empty", "aten.empty_strided", "aten.empty_like",
    "aten.new_empty", "aten.new_empty_strided", "aten.narrow", "aten.chunk", "aten.view_as_real",
    "aten.view_as_complex", "aten.unflatten", "aten.flatten", "aten.movedim",
})


@dataclass(frozen=True)
class OpListDiff:
    """Kernel-launching ops one side ran more often than the other (name -> count)."""

    device_only: dict[str, int]
    trace_only: dict[str, int]

    @property
    def same(self) -> bool:
        return not self.device_only and not self.trace_only


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func.namespace not in _NOT_OPS:
            self.counts[op_name(func)] += 1
        return func(*args, **(kwargs or {}))


_NOT_OPS = {"prim", "profiler"}  # record_function markers, primitives: no kernels of their own


def op_name(func: Any) -> str:
    """``aten.mm``: the overload packet's name, as the trace's events name their ops."""
    return str(func.overloadpacket)


def record_ops(run: Callable[[], Any]) -> Counter[str]:
    """The ops ``run()`` dispatches (below autograd: what the device's kernels were called for)."""
    with _CountOps() as counter:
        run()
    return counter.counts


def trace_ops(trace: Trace) -> Counter[str]:
    return Counter(e.name for e in trace.events)


def compare(device: Counter[str], traced: Counter[str]) -> OpListDiff:
    """What each side ran that the other did not, kernels only, stand-ins matched."""
    device = Counter({k: v for k, v in device.items() if k not in NOT_KERNELS})
    traced = Counter({k: v for k, v in traced.items() if k not in NOT_KERNELS})
    # ops both ran cancel first: a stand-in pairs only with what is left on the device
    device, traced = device - traced, traced - device
    for stand_in, names in SAME_WORK.items():
        for name in names:
            matched = min(traced[stand_in], device[name])
            traced[stand_in] -= matched
            device[name] -= matched
    return OpListDiff(dict(sorted((+device).items())), dict(sorted((+traced).items())))


def device_step_ops(build: Callable[[], Any], options: Any, device: torch.device) -> Counter[str]:
    """The ops of a steady-state step (after one warm-up step) of ``build``'s workload."""
    from nnperf.measure.step import build_step

    step = build_step(build, options, device)
    step.run()  # the warm-up creates the optimizer's state, as the trace's does
    return record_ops(step.run)
