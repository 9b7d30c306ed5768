"""``nnperf calibrate``: measure this device and write a profile ``predict --profile`` uses."""

from __future__ import annotations

import sys

import click

from nnperf import stopping
from nnperf.cli.app import cli
from nnperf.cli.paths import check_output, os_errors_as_usage


@cli.command()
@click.option("--device", "device_name", metavar="cpu|cuda[:N]",
              help="Device to calibrate (default: cuda when available, else cpu).")
@click.option("--quick", is_flag=True, help="A reduced grid (under a minute, also on a small CPU).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Profile TOML to write (default nnperf-profile-<device>.toml); raw JSON beside it.")
@click.option("--device-file", type=click.Path(dir_okay=False),
              help="CPU only: where to write the device description (default <output>-device.toml).")
@click.option("--gpu", "-g", "gpu", metavar="NAME",
              help="CUDA only: the catalog GPU whose datasheet peaks the efficiencies are relative to "
                   "(default: the one matching the device name).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw measurements as JSON.")
@click.option("--kernel-bench", "kernel_bench", type=click.Path(dir_okay=False),
              help="CUDA only: a kernel-bench.json (validation/kernel_bench.py) whose rows set the kernel "
                   "constants it measures (batch norm's loop round trip, depthwise rates, the RGB stem).")
def calibrate(device_name, quick, output, device_file, gpu, as_json, kernel_bench) -> None:
    """Microbenchmark GEMMs, convolutions, bandwidth, launch cost and (CUDA) host-device copies."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nnperf.cli.gpu_options import resolve_gpu
    from nnperf.measure.calibration import (
        Outputs,
        measured_table,
        new_calibration,
        plan_for,
        run_calibration,
        write_outputs,
    )
    from nnperf.measure.calibration.kernel_bench import load_kernel_bench
    from nnperf.measure.device import resolve_device

    bench_doc = load_kernel_bench(kernel_bench) if kernel_bench else None  # read before the minutes of measuring
    device = resolve_device(device_name)
    cuda = device.type == "cuda"
    target = None
    if cuda:
        import torch

        target = resolve_gpu(gpu if gpu is not None else torch.cuda.get_device_name(device))
    elif gpu is not None:
        click.echo("note: --gpu is ignored for a CPU calibration", err=True)
    if bench_doc is not None and not cuda:
        click.echo("note: --kernel-bench is ignored for a CPU calibration (its rows are a GPU's)", err=True)
    outputs = Outputs.for_profile(output or f"nnperf-profile-{device.type}.toml", device_file, cpu=not cuda)
    # checked before the minutes of measuring, written (folders created) after them
    for path, option in ((outputs.profile, "--output"), (outputs.raw, "--output (its raw JSON)"),
                         (outputs.device, "--device-file")):
        if path is not None:
            check_output(path, option)
    plan = plan_for(device, quick=quick)
    cal = new_calibration(device, quick)
    bars = Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=as_json, disable=as_json or not sys.stderr.isatty(),
                    console=Console(stderr=True))
    tasks = {}
    try:
        with bars:
            for group, total in plan.counts().items():
                if total:
                    tasks[group] = bars.add_task(group, total=total)

            def progress(group: str, done: int) -> None:
                stopping.check()  # a stop whose exception was lost on the way (``nnperf.stopping``)
                bars.update(tasks[group], completed=done)

            run_calibration(device, plan, progress, result=cal)
    except KeyboardInterrupt:
        click.secho("nnperf: calibration interrupted; nothing was written (a partial calibration is never "
                    "saved as a profile)", fg="red", err=True)
        sys.exit(130)
    with os_errors_as_usage("--output", outputs.profile):  # atomic: temp files renamed together
        write_outputs(cal, target, outputs, bench_doc)
    paths = [str(p) for p in outputs.paths()]
    noisy = cal.noisy()
    if noisy:
        worst = ", ".join(f"{what} ({ratio:.1f}x)" for what, ratio in noisy[:3])
        click.secho(f"warning: {len(noisy)} measurements varied more than 2x between repeats (worst: {worst}); "
                    "something else was using the device, so the profile may be off: rerun on an idle "
                    "machine", fg="yellow", err=True)
    if as_json:
        click.echo(json.dumps({**cal.to_json(), "written": paths}, indent=2))
        return
    from nnperf.report.measure_tables import print_calibration

    print_calibration(cal, measured_table(cal), paths)
    if not cuda:
        click.echo(f"Predict on this CPU: nnperf predict MODEL --gpu-file {outputs.device} --profile {outputs.profile}")
    else:
        click.echo(f"Use it: nnperf predict MODEL --gpu {target.id} --profile {outputs.profile}")
