"""``nnperf measure MODEL --layout PLAN.json[:K]`` under torchrun: a planned layout run for real,
every rank's figures beside the plan's (``measure.distributed``)."""

from __future__ import annotations

import json
from typing import Any

import click

from nnperf.cli.workload_options import pop_workload
from nnperf.errors import UsageError
from nnperf.units import binary


def measure_planned_layout(layout: str, device: str | None, steps: int, warmup: int, as_json: bool,
                           workload_kwargs: dict[str, Any]) -> None:
    from nnperf.measure.distributed import check_model, measure_layout
    from nnperf.measure.plan_file import read_layout
    from nnperf.search.plan import request_name

    layout_file = read_layout(layout)
    execution, planned = layout_file.execution, layout_file.planned
    if execution.shards_optimizer_only and execution.expert > 1:
        raise UsageError(f"--layout {layout}: ZeRO-1 with expert parallelism is planned, not run (DDP rebuilds its "
                         "buckets after the first step without the experts' own group); measure a ddp or fsdp layout")
    if execution.tp_comm_overlap:
        raise UsageError(f"--layout {layout}: --tp-comm-overlap is planned, not run (the ranks run DTensor's "
                         "collectives, not Transformer Engine's userbuffers); measure a plan without it")
    if execution.async_tp:
        raise UsageError(f"--layout {layout}: --async-tp is planned, not run (the ranks run DTensor's collectives "
                         "eagerly, not Inductor's compiled blocks); measure a plan without it")
    if execution.expert_overlap:
        raise UsageError(f"--layout {layout}: --ep-overlap is planned, not run (the ranks run each micro-batch's "
                         "forward and backward one after the other, not Megatron-Core's combined 1F1B); measure "
                         "a plan without it")
    request, options = pop_workload(workload_kwargs)
    if request_name(request) != layout_file.model:
        raise UsageError(f"--layout {layout} is a plan of {layout_file.model}; measure that model "
                         f"(got {request_name(request)})")
    layout_file.check_options(options, layout)
    check_model(request, {"model_options": layout_file.model_options, "seq_len": layout_file.seq_len}, layout)
    if device not in (None, "cpu", "cuda"):
        raise UsageError(f"--device {device}: with --layout each rank takes its own GPU (LOCAL_RANK); "
                         "give cpu or cuda")
    measured = measure_layout(request, options, execution, device, steps, warmup)
    if measured is None:  # ranks other than 0 report through rank 0
        return
    doc = {"schema": "nnperf.layout_measurement/1", "model": layout_file.model, "planned_gpu": layout_file.gpu,
           "planned": planned, "measured": measured.to_json(),
           "comparable": measured.device == "cuda",
           "step_time_error": _error(planned.get("step_time_s"), measured.step_s) if measured.device == "cuda"
           else None}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        _print(doc)


def _error(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured - 1 if predicted and measured else None


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from nnperf.report.console import make_console

    m, p = doc["measured"], doc["planned"]
    title = (f"{doc['model']}: {m['layout']} measured on {m['ranks'][0]['device_name']} x{len(m['ranks'])} "
             f"({m['backend']}); planned for {doc['planned_gpu']}")
    table = Table(title=title)
    for column in ("rank", "step (median)", "parameters", "gradients", "optimizer state", "peak memory",
                   "exposed communication"):
        table.add_column(column, justify="right")
    state = p.get("per_rank_state_bytes", {})
    label = "planned" if p.get("rank") is None else f"planned (rank {p['rank']})"
    table.add_row(label, f"{p['step_time_s'] * 1e3:.2f} ms", binary(state.get("parameters", 0)),
                  binary(state.get("gradients", 0)), binary(state.get("optimizer_state", 0)),
                  binary(p["memory_bytes"]) + " (device total)",
                  f"{sum(p['time_split_s'].get('exposed_communication_s', {}).values()) * 1e3:.2f} ms")
    for r in m["ranks"]:
        exposed = r["exposed_communication_s"]
        peak = binary(r["peak_memory_bytes"]) if r["peak_memory_bytes"] is not None else "n/a"
        if r["peak_reserved_bytes"] is not None:
            peak += f" ({binary(r['peak_reserved_bytes'])} reserved)"
        table.add_row(str(r["rank"]), f"{r['step_time_s'] * 1e3:.2f} ms", binary(r["state_bytes"]["parameters"]),
                      binary(r["state_bytes"]["gradients"]), binary(r["state_bytes"]["optimizer_state"]), peak,
                      f"{exposed * 1e3:.2f} ms" if exposed is not None else "not measured (no GPU)")
    make_console().print(table)
    if doc["comparable"]:
        click.echo(f"step: measured {m['step_time_s'] * 1e3:.2f} ms (slowest rank), planned "
                   f"{p['step_time_s'] * 1e3:.2f} ms: error {doc['step_time_error']:+.1%}")
    else:
        click.echo("measured on CPUs: times and memory are not comparable with the plan's GPU figures; the "
                   "per-rank state bytes are")
