"""``nnperf.analyze``: trace a workload once and run the counting passes over it.

The ``Analysis`` object is what every later command extends (prediction, memory,
measurement); its JSON form is the contract documented in the README.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn

from nnperf.loading import resolve
from nnperf.passes import rollup
from nnperf.passes.count import OpCount, count_ops
from nnperf.passes.estimates import Estimates
from nnperf.passes.gemms import Gemm, step_gemms
from nnperf.request import InputSpec, ModelRequest, model_label
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import Trace, dtype_name
from nnperf.trace.options import TraceOptions
from nnperf.workload import LossFn, Workload

SCHEMA_VERSION = "nnperf.analysis/1"


@dataclass
class Analysis:
    """A traced step and its counts. Tables are computed on demand from the op counts.

    ``gemms`` are the GEMMs the counting pass lowered each op to, flattened in trace order
    (each is also on its ``OpCount``): lowered once, here, for every later pass."""

    model: str
    options: TraceOptions
    trace: Trace
    workload: Workload
    ops: list[OpCount]
    gemms: list[Gemm]
    extra: dict[str, Any] = field(default_factory=dict)  # sections added by later passes
    #: The built-in model's config changes (``-O n_layer=2``) the workload was built with.
    model_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_trace(cls, model: str, options: TraceOptions, trace: Trace, workload: Workload) -> Analysis:
        """Run the counting passes over a traced step: the one ``analyze`` traced, or a variant
        the memory command traced itself (checkpointing, gradient accumulation)."""
        ops = count_ops(trace)
        return cls(model=model, options=options, trace=trace, workload=workload, ops=ops, gemms=step_gemms(ops))

    @property
    def label(self) -> str:
        """The model as table headers name it, ``-O`` changes included (``llama-7b (n_layer=2)``)."""
        return model_label(self.model, self.model_options)

    # -- tables -------------------------------------------------------------------------------
    def modules(self, depth: int | None = None) -> list[rollup.ModuleRow]:
        return rollup.by_module(self.trace, self.ops, depth)

    def op_table(self) -> dict[str, Estimates]:
        return rollup.by_op(self.ops)

    def phases(self) -> dict[str, Estimates]:
        return rollup.by_phase(self.ops)

    @property
    def root_type(self) -> str:
        """The model's class name, as tables label the whole model ("(ResNet)")."""
        return self.trace.module_types.get("", type(self.workload.model).__name__)

    @cached_property
    def coverage(self) -> dict[str, Any]:
        return rollup.coverage(self.ops)

    @cached_property
    def totals(self) -> dict[str, Any]:
        total = Estimates.from_counts(self.ops)
        shapes = self.trace.param_shapes
        params = sum(math.prod(shapes[n]) for n in self.trace.param_storages.values())  # tied once
        param_bytes = sum(self.trace.storages[s].nbytes for s in self.trace.param_storages)
        return {
            "params": params,
            "param_bytes": param_bytes,
            **total.counts_json(),
            "bytes_forward": total.bytes_forward,
            "bytes_backward": total.bytes_backward,
            "bytes_optimizer": total.bytes_optimizer,
            "ops": len(self.ops),
            "gemms": len(self.gemms),
        }

    @property
    def config(self) -> dict[str, Any]:
        shapes = self.trace.config.get("inputs", [])  # as traced, after a --dtype cast
        return {
            "batch": self.workload.samples,
            "tokens": self.workload.tokens,
            "mode": self.trace.mode,
            "dtype": self.options.dtype or _param_dtype(self.workload.model),
            "amp": self.options.amp,
            "optimizer": self.options.optimizer if self.options.train else None,
            "optimizer_impl": self.options.optimizer_impl if self.options.train else None,
            "inputs": shapes,
            **({"channels_last": True} if self.options.channels_last else {}),
            **({"sdpa": self.options.sdpa} if self.options.sdpa != "fused" else {}),
            **({"pointwise": self.options.pointwise} if self.options.pointwise != "eager" else {}),
            **({"assumptions": self.trace.config["assumptions"]} if self.trace.config.get("assumptions") else {}),
            **self.workload.info,
        }

    # -- exports ------------------------------------------------------------------------------
    def to_json(self, depth: int | None = None) -> dict[str, Any]:
        doc = {
            "schema": SCHEMA_VERSION,
            "model": self.model,
            "config": self.config,
            "totals": self.totals,
            "modules": [r.to_json() for r in self.modules(depth)],
            "ops": [{"op": name, **t.counts_json(), "count": t.count} for name, t in self.op_table().items()],
            "gemms": [g.to_json() for g in self.gemms],
            "coverage": self.coverage,
        }
        doc.update(self.extra)
        return doc

    def to_csv(self, by: str = "module", depth: int | None = None) -> str:
        buf = io.StringIO()
        if by == "gemm":
            rows = [g.to_json() for g in self.gemms]
        elif by == "op":
            rows = [{"op": n, "count": t.count, **t.counts_json()} for n, t in self.op_table().items()]
        else:
            rows = [r.to_json() for r in self.modules(depth)]
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return buf.getvalue()

    def _repr_html_(self) -> str:
        """Notebook display: the per-module table as HTML (names escaped)."""
        from nnperf.report.html import analysis_html

        return analysis_html(self)

    def __repr__(self) -> str:
        t = self.totals
        return (
            f"Analysis({self.model!r}, mode={self.trace.mode}, params={t['params']:,}, "
            f"flops={t['flops']:.4g}, bytes={t['bytes']:.4g}, "
            f"coverage={self.coverage['op_share']:.1%} of ops)"
        )


def _param_dtype(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return dtype_name(p.dtype) if p is not None else "fp32"


def analyze(
    model: str | nn.Module,
    inputs: Sequence[Any] | torch.Tensor | None = None,
    *,
    train: bool = True,
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    dtype: str | None = None,
    amp: str | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    loss_fn: LossFn | None = None,
    input_spec: InputSpec | None = None,
    real: bool = False,
    channels_last: bool = False,
    task: str | None = None,
    attn_implementation: str | None = None,
    moe_load: Sequence[float] | None = None,
    moe_capacity_factor: float | None = None,
    sdpa: str = "fused",
    loss: str = "eager",
    clip_grad_norm: float | None = None,
    fp8: bool = False,
    pointwise: str = "eager",
    **overrides: Any,
) -> Analysis:
    """Trace one step of ``model`` on meta or fake tensors and count it.

    ``model`` is a zoo name (``"resnet50"``), a library model (``"hf:gpt2"``,
    ``"timm:convnext_tiny"``, ``"tv:resnet50"``; ``task`` and ``attn_implementation`` for
    ``hf:``), ``"file.py:factory"``, ``"pkg.mod:factory"`` or an ``nn.Module`` (its weights are
    swapped for fakes during the trace, then restored). ``moe_load`` / ``moe_capacity_factor``:
    the expert load a fake trace assumes for mixture-of-experts routing (``trace.routing``);
    ``sdpa="unfused"``: attention as the unfused kernels (``trace.attention``);
    ``loss="compiled"``: the loss as ``torch.compile(loss_fn)`` runs it (``trace.loss``);
    ``clip_grad_norm``: the gradients clipped to that norm before the optimizer (``trace.clip``);
    ``fp8``: the linear layers of the repeated blocks in FP8, as Transformer Engine runs them
    (``TraceOptions.fp8``; with ``amp="bf16"``); ``pointwise="fused"``: the pointwise ops of
    the repeated blocks between two other kernels as one kernel each (``passes.fusion``).
    The keywords are spelled out for notebook use; they make a ``ModelRequest`` (what to
    build) and ``TraceOptions`` (how to run the step) for ``analyze_request``.
    """
    request = ModelRequest(
        model,
        batch=batch,
        seq_len=seq_len,
        inputs=inputs,
        input_spec=input_spec or InputSpec(),
        loss_fn=loss_fn,
        overrides=overrides,
        task=task,
        attn_implementation=attn_implementation,
    )
    options = TraceOptions(
        train=train, optimizer=optimizer, optimizer_impl=optimizer_impl, dtype=dtype, amp=amp,
        real=real, channels_last=channels_last,
        moe_load=tuple(moe_load) if moe_load is not None else None,
        moe_capacity_factor=moe_capacity_factor, sdpa=sdpa, loss=loss, clip_grad_norm=clip_grad_norm,
        fp8=fp8, pointwise=pointwise,
    )
    return analyze_request(request, options)


def analyze_request(request: ModelRequest, options: TraceOptions) -> Analysis:
    """Build the requested workload inside the tracing context, trace one step and count it."""
    name, build = resolve(request)
    trace, workload = trace_workload(build, options)
    analysis = Analysis.from_trace(name, options, trace, workload)
    analysis.model_options = dict(request.overrides)
    return analysis
