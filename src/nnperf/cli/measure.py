"""``nnperf measure``: run the step for real on this machine and put it beside the prediction."""

from __future__ import annotations

import json

import click

from nnperf import progress
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import GpuRequest, GpuTarget, gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.cli.paths import check_output, write_output
from nnperf.cli.workload_options import cudnn_benchmark_option, pop_workload, workload_options
from nnperf.errors import UsageError


def prediction_target(device, request: GpuRequest) -> tuple[GpuTarget | None, str | None]:
    """The target to predict with, or (None, note) when no prediction applies.

    CUDA: ``--gpu``/``--gpu-file``, else the catalog entry matching the device name. CPU: only
    a description given explicitly (``--gpu-file`` from ``nnperf calibrate --device cpu``);
    what-ifs or a profile without one would be dropped, so they are refused.
    """
    if request.given:
        return request.resolve()[0], None
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        try:
            return request.resolve(default=name)[0], None
        except UsageError:
            if request.set_values or request.profile_file:
                raise UsageError(f"'{name}' is not in nnperf's GPU catalog, so --set/--profile have "
                                 "no GPU to apply to: pass --gpu NAME or --gpu-file") from None
            return None, (f"'{name}' is not in nnperf's GPU catalog: pass --gpu NAME or --gpu-file "
                          "to get a prediction beside the measurement")
    if request.set_values or request.profile_file:
        raise UsageError("--set/--profile change a prediction, and on the CPU nnperf predicts only "
                         "from a calibration: add --gpu-file cpu-profile-device.toml (written by "
                         "'nnperf calibrate --device cpu')")
    return None, ("No CPU prediction available: nnperf predicts CPUs only from a calibration. Run "
                  "'nnperf calibrate --device cpu -o cpu-profile.toml', then pass "
                  "--gpu-file cpu-profile-device.toml --profile cpu-profile.toml.")


@cli.command()
@workload_options
@click.option("--device", "device_name", metavar="cpu|cuda[:N]",
              help="Where to run the step (default: cuda when available, else cpu).")
@click.option("--steps", type=LimitedInt("steps"), default=10, show_default=True, help="Timed steps.")
@click.option("--warmup", type=LimitedInt("warmup"), default=3, show_default=True, help="Untimed warm-up steps.")
@gpu_options(resolve=False)
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="Let fp32 matmuls use TF32 (set for the measurement and the prediction).")
@cudnn_benchmark_option
@click.option("--ops/--no-ops", default=True, show_default=True,
              help="Profile one extra step to attribute time to modules and ops.")
@click.option("--depth", type=LimitedInt("depth"), default=2, show_default=True,
              help="Module tree depth shown (0: the whole model only).")
@click.option("--trace-out", type=click.Path(dir_okay=False), help="Write the profiled step as a Chrome trace.")
@click.option("--layout", metavar="PLAN.json[:K]",
              help="Run the K-th ranked layout (default the winner) of 'nnperf plan --json' for real, one "
                   "process per rank under torchrun (NCCL on GPUs, gloo on CPUs), beside the plan's figures.")
@click.option("--json", "as_json", is_flag=True, help="Print predict --json's document with measured values.")
def measure(device_name, steps, warmup, gpu_request: GpuRequest, tf32, cudnn_benchmark, ops, depth,
            trace_out, layout, as_json, **kwargs) -> None:
    """Measure one step of MODEL on this machine (CPU or CUDA GPU) beside nnperf's prediction;
    with --layout, one rank of a planned multi-GPU layout under torchrun."""
    if layout:
        if cudnn_benchmark:
            raise UsageError("--cudnn-benchmark is not applied to a --layout run (its ranks run as "
                             "torchrun starts them); drop one of the two")
        from nnperf.cli.measure_layout import measure_planned_layout

        measure_planned_layout(layout, device_name, steps, warmup, as_json, kwargs)
        return
    from nnperf.measure.device import resolve_device
    from nnperf.measure.runner import combined_json
    from nnperf.measure.runner import measure as run_measure

    device = resolve_device(device_name)
    if trace_out and not ops:
        raise UsageError("--trace-out needs the profiled step; drop --no-ops")
    target, note = prediction_target(device, gpu_request)
    request, options = pop_workload(kwargs)
    if trace_out:
        trace_out = check_output(trace_out, "--trace-out")
    with progress.shown(f"measure on {device}: steps", enabled=not as_json):
        if trace_out:  # the profiler writes it after the steps, to a temporary name renamed into place
            measurement, analysis = write_output(trace_out, "--trace-out", lambda tmp: run_measure(
                request, options, device=device, steps=steps, warmup=warmup, tf32=tf32,
                cudnn_benchmark=cudnn_benchmark, profile_ops=ops, trace_out=str(tmp)))
        else:
            measurement, analysis = run_measure(request, options, device=device, steps=steps, warmup=warmup,
                                                tf32=tf32, cudnn_benchmark=cudnn_benchmark, profile_ops=ops)
    prediction = None
    if target is not None:
        from nnperf.prediction import predict_analysis, timing_options

        prediction = predict_analysis(analysis, target.gpu, target.profile, timing_options(tf32, cudnn_benchmark))
    doc = combined_json(measurement, analysis, prediction, depth)
    if note:
        doc["prediction_note"] = note
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    from nnperf.report.measure_tables import print_measurement

    print_measurement(doc)
    if trace_out:
        click.echo(f"wrote the measured timeline to {trace_out} (open in chrome://tracing or Perfetto)", err=True)
