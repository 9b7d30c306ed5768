"""``--layout PLAN.json[:K]``: a layout of a ``nnperf plan --json`` document, read into typed
records before anything runs.

The document may have been edited by hand: every field ``measure --layout`` uses is checked
for its type and range here (``nnperf.fields``), and the layout by ``Execution.validate``, so
that a pipeline degree of 0, a micro-batch of -2, an accumulation of NaN or options given as a
string are one line naming the field, not a traceback in every rank of a torchrun job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from nnperf import fields
from nnperf.errors import UsageError, read_user_text
from nnperf.layout import (
    CHECKPOINTS,
    DATA_PARALLEL,
    FRAMEWORKS,
    OPTIMIZER_STATES,
    TOKEN_DISPATCHERS,
    Execution,
)
from nnperf.request import INDEX_MAX, LIMITS
from nnperf.search.plan.results import PLAN_SCHEMA
from nnperf.trace.options import TraceOptions

#: The most ranks or GPUs a plan lays out (``nnperf plan --gpus``).
MAX_GPUS = 65536
_FROM_PLAN = "give the output of 'nnperf plan ... --json'"


@dataclass(frozen=True)
class PlannedLayout:
    """The K-th ranked layout of a plan and what it was planned with."""

    execution: Execution
    planned: dict[str, Any]  # the ranked row: figures checked where ``measure`` reads them
    model: str
    model_options: dict[str, Any]
    seq_len: int | None
    gpu: str
    options: dict[str, Any]  # ``TraceOptions.to_json()`` of the planned step

    def check_options(self, options: TraceOptions, where: str) -> None:
        """The measured step must be the planned one: the same training step options."""
        mine = options.to_json()
        differ = [k for k, v in self.options.items() if k not in ("autocast_device", "real") and mine.get(k) != v]
        if differ:
            wanted = ", ".join(f"{k}={self.options[k]!r}" for k in differ)
            raise UsageError(f"--layout {where} was planned with {wanted}; measure with the same workload options "
                             f"(got {', '.join(f'{k}={mine.get(k)!r}' for k in differ)})")


def read_layout(path: str) -> PlannedLayout:
    """The layout ``PATH[:K]`` names: the K-th ranked layout (default 0, the winner)."""
    file, index_text = _split(path)
    text = read_user_text(file, f"--layout {path}: plan", "the JSON 'nnperf plan ... --json' prints")
    try:
        plan = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        raise UsageError(f"--layout {path}: {file} is not JSON; {_FROM_PLAN}") from None
    except ValueError as err:  # NaN, Infinity: no field of a plan holds one
        raise UsageError(f"--layout {path}: {file} holds {err}; {_FROM_PLAN}") from None
    if not isinstance(plan, dict) or plan.get("schema") not in (PLAN_SCHEMA, "nnperf.plan/1"):
        raise UsageError(f"--layout {path}: {file} is not a plan (schema {PLAN_SCHEMA}); {_FROM_PLAN}")
    where = f"--layout {path}:"
    ranked = fields.items(plan.get("ranked"), f"{where} ranked")
    if not ranked:
        raise UsageError(f"--layout {path}: the plan has no layout that fits")
    if not (index_text or "0").isdigit() or int(index_text or 0) >= len(ranked):
        raise UsageError(f"--layout {path}: {index_text!r} is not a position in the plan's {len(ranked)} ranked "
                         f"layouts; valid: 0 to {len(ranked) - 1}")
    index = int(index_text or 0)
    at = f"{where} ranked[{index}]"
    row = dict(fields.table(ranked[index], at))
    execution = execution_of(row.get("execution"), f"{at}.execution")
    if plan["schema"] == "nnperf.plan/1" and execution.uneven and execution.chunks_per_rank > 1:
        raise UsageError(f"--layout {path}: a plan of schema nnperf.plan/1 counted first/last_stage_layers as the "
                         "model's first and last chunk, not its end stages; re-run 'nnperf plan ... --json'")
    _check_figures(row, at)
    options = dict(fields.table(plan.get("options"), f"{where} options"))
    model_options = dict(fields.table(plan.get("model_options", {}), f"{where} model_options"))
    for key, value in model_options.items():
        if not isinstance(value, (str, int, float, bool)):  # NaN is refused as the JSON is read
            raise UsageError(f"{where} model_options.{key} is {value!r}; expected a -O value")
    seq = plan.get("seq_len")
    seq_len = None if seq is None else fields.integer(seq, f"{where} seq_len", 1, INDEX_MAX)
    return PlannedLayout(execution, row, fields.text(plan.get("model"), f"{where} model"), model_options,
                         seq_len, fields.text(plan.get("gpu"), f"{where} gpu"), options)


def _split(path: str) -> tuple[str, str]:
    """``PATH:K`` -> (PATH, "K"); a path with a colon in its name, or no index -> (path, "")."""
    file, colon, index_text = path.rpartition(":")
    if os.path.exists(path) or not colon or not file:
        return path, ""
    return file, index_text


def _no_constant(name: str) -> float:
    raise ValueError(f"{name}, which is no number a plan holds")


def execution_of(record: Any, what: str) -> Execution:
    """An ``Execution`` from its JSON (``Execution.to_json``), every field checked; derived
    fields (``replicate``, ``global_batch``) are left to be derived again."""
    record = fields.table(record, what)
    counts = {"world": (1, MAX_GPUS), "shard": (1, MAX_GPUS), "gpus_per_node": (1, 1024),
              "micro_batch": (1, INDEX_MAX), "grad_accum": (LIMITS["grad_accum"].low, LIMITS["grad_accum"].high),
              "tensor": (1, MAX_GPUS), "pipeline": (1, MAX_GPUS), "context": (1, MAX_GPUS),
              "expert": (1, MAX_GPUS), "bucket_bytes": (1, 2**40), "virtual_stages": (1, 1024)}
    values: dict[str, Any] = {}
    for name, spec in Execution.__dataclass_fields__.items():
        if name not in record:
            continue  # the dataclass's default
        value, field_what = record[name], f"{what}.{name}"
        if name in counts:
            values[name] = fields.integer(value, field_what, *counts[name])
        elif name in ("first_stage_layers", "last_stage_layers"):  # null: an even split; 0: the
            # embedding (the head) alone on a one-chunk end stage (layout.split_layers)
            values[name] = None if value is None else fields.integer(value, field_what, 0, INDEX_MAX)
        elif spec.type in ("bool", bool):
            values[name] = fields.flag(value, field_what)
        elif name == "data":
            values[name] = fields.text(value, field_what, DATA_PARALLEL)
        elif name == "checkpoint":
            values[name] = None if value is None else fields.text(value, field_what, CHECKPOINTS)
        elif name == "pipeline_schedule":
            values[name] = None if value is None else fields.text(value, field_what)
        elif name == "expert_tensor":  # null: Megatron-Core's default
            values[name] = None if value is None else fields.integer(value, field_what, 1, MAX_GPUS)
        elif name == "token_dispatcher":
            values[name] = fields.text(value, field_what, TOKEN_DISPATCHERS)
        elif name == "optimizer_states":
            values[name] = fields.text(value, field_what, tuple(OPTIMIZER_STATES))
        elif name == "framework":  # null: the one the layout implies
            values[name] = None if value is None else fields.text(value, field_what, FRAMEWORKS)
        else:
            raise AssertionError(f"Execution.{name} has no JSON check")  # a new field needs one here
    if "world" not in values:
        raise UsageError(f"{what}.world is missing; {_FROM_PLAN}")
    execution = Execution(**values)
    try:
        execution.validate()
    except UsageError as err:
        raise UsageError(f"{what}: {err}") from None
    return execution


def _check_figures(row: dict[str, Any], at: str) -> None:
    """The planned figures ``measure`` shows beside its own: numbers where it reads numbers."""
    fields.number(row.get("step_time_s"), f"{at}.step_time_s", 0)
    fields.number(row.get("memory_bytes"), f"{at}.memory_bytes", 0)
    for key, value in fields.table(row.get("per_rank_state_bytes", {}), f"{at}.per_rank_state_bytes").items():
        fields.number(value, f"{at}.per_rank_state_bytes.{key}", 0)
    split = fields.table(row.get("time_split_s", {}), f"{at}.time_split_s")
    for key, value in fields.table(split.get("exposed_communication_s", {}),
                                   f"{at}.time_split_s.exposed_communication_s").items():
        fields.number(value, f"{at}.time_split_s.exposed_communication_s.{key}", 0)
    if row.get("rank") is not None:
        fields.integer(row["rank"], f"{at}.rank", 0, MAX_GPUS)
