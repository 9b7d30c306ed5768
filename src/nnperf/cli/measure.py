"""``nnperf measure``: run the step for real on this machine and put it beside the prediction."""

from __future__ import annotations

import json

import click

from nnperf.cli.app import cli
from nnperf.cli.paths import prepare_output
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import UsageError


def prediction_target(device, gpu: str | None, gpu_file: str | None, set_values, profile_file):
    """(GPU, profile) to predict with, or (None, note) when no prediction applies.

    CUDA: ``--gpu``/``--gpu-file``, else the catalog entry matching the device name. CPU: only
    a description given explicitly (``--gpu-file`` from ``nnperf calibrate --device cpu``).
    """
    from nnperf.cli.gpu_options import resolve_gpu, resolve_profile

    if device.type == "cuda" and not gpu and not gpu_file:
        import torch

        name = torch.cuda.get_device_name(device)
        try:
            found = resolve_gpu(name, None, set_values)
        except UsageError:
            return None, (f"'{name}' is not in nnperf's GPU catalog: pass --gpu NAME or --gpu-file "
                          "to get a prediction beside the measurement")
        return (found, resolve_profile(found, profile_file)), None
    if device.type == "cpu" and not gpu and not gpu_file:
        return None, ("No CPU prediction available: nnperf predicts CPUs only from a calibration. Run "
                      "'nnperf calibrate --device cpu -o cpu-profile.toml', then pass "
                      "--gpu-file cpu-profile-device.toml --profile cpu-profile.toml.")
    found = resolve_gpu(gpu, gpu_file, set_values)
    return (found, resolve_profile(found, profile_file)), None


@cli.command()
@workload_options
@click.option("--device", "device_name", metavar="cpu|cuda[:N]",
              help="Where to run the step (default: cuda when available, else cpu).")
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed warm-up steps.")
@click.option("--gpu", "-g", "gpu", metavar="NAME",
              help="Predict on this catalog GPU (default on CUDA: the one matching the device name).")
@click.option("--gpu-file", type=click.Path(dir_okay=False),
              help="Device description to predict with (a catalog-schema TOML; on the CPU the one "
                   "'nnperf calibrate --device cpu' writes).")
@click.option("--set", "set_values", multiple=True, metavar="KEY=VALUE", help="What-if change to the GPU.")
@click.option("--profile", "profile_file", type=click.Path(dir_okay=False),
              help="A device profile measured by 'nnperf calibrate'.")
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="Let fp32 matmuls use TF32 (set for the measurement and the prediction).")
@click.option("--ops/--no-ops", default=True, show_default=True,
              help="Profile one extra step to attribute time to modules and ops.")
@click.option("--depth", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--trace-out", type=click.Path(dir_okay=False), help="Write the profiled step as a Chrome trace.")
@click.option("--json", "as_json", is_flag=True, help="Print predict --json's document with measured values.")
def measure(device_name, steps, warmup, gpu, gpu_file, set_values, profile_file, tf32, ops, depth,
            trace_out, as_json, **kwargs) -> None:
    """Measure one step of MODEL on this machine (CPU or CUDA GPU) beside nnperf's prediction."""
    from nnperf.measure.device import resolve_device
    from nnperf.measure.runner import combined_json
    from nnperf.measure.runner import measure as run_measure

    device = resolve_device(device_name)
    if trace_out and not ops:
        raise UsageError("--trace-out needs the profiled step; drop --no-ops")
    target, note = prediction_target(device, gpu, gpu_file, set_values, profile_file)
    request, options = pop_workload(kwargs)
    if trace_out:  # the profiler writes it after the steps: check and make its folder first
        trace_out = str(prepare_output(trace_out, "--trace-out"))
    measurement, analysis = run_measure(request, options, device=device, steps=steps,
                                        warmup=warmup, tf32=tf32, profile_ops=ops,
                                        trace_out=trace_out)
    prediction = None
    if target is not None:
        from nnperf.passes.timing import TimingOptions
        from nnperf.prediction import predict_analysis

        prediction = predict_analysis(analysis, target[0], target[1], TimingOptions(tf32_matmul=tf32))
    doc = combined_json(measurement, analysis, prediction, depth)
    if note:
        doc["prediction_note"] = note
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    from nnperf.report.measure_tables import print_measurement

    print_measurement(doc)
    if trace_out:
        click.echo(f"wrote the measured timeline to {trace_out} (open in chrome://tracing or Perfetto)")
