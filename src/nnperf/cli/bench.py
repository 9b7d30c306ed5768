"""``nnperf bench``: small experiments that check one claim of the model against this machine."""

from __future__ import annotations

import json

import click

from nnperf.cli.app import cli
from nnperf.cli.limits import LimitedInt
from nnperf.errors import UsageError, shown
from nnperf.request import LIMITS


@cli.group()
def bench() -> None:
    """Experiments measured on this machine beside nnperf's predictions."""


def _sizes(text: str | None) -> list[int]:
    from nnperf.measure.transfer import DEFAULT_SIZES

    if not text:
        return list(DEFAULT_SIZES)
    limit = LIMITS["transfer_n"]
    try:
        sizes = [int(s) for s in text.replace(" ", "").split(",")]
    except ValueError:
        raise UsageError(f"invalid --sizes {shown(text)}: expected integers such as 64,128,256") from None
    if not all(limit.low <= n <= limit.high for n in sizes):
        raise UsageError(f"invalid --sizes {shown(text)}: every n must be {limit.describe()}")
    return sizes


@bench.command()
@click.option("--device", "device_name", metavar="cpu|cuda[:N]",
              help="GPU to measure (default: cuda when available; cpu: CPU only, GPU predicted).")
@click.option("--sizes", help="Comma-separated n values (default 32,64,128,200,256,512,1024,2048).")
@click.option("--gpu", "-g", "gpu", metavar="NAME",
              help="GPU to predict (default: the one measured, else h100).")
@click.option("--profile", "profile_file", type=click.Path(dir_okay=False), help="GPU profile from calibration.")
@click.option("--cpu-file", type=click.Path(dir_okay=False),
              help="CPU description from 'nnperf calibrate --device cpu' (predicts the CPU column).")
@click.option("--cpu-profile", type=click.Path(dir_okay=False), help="CPU profile from the same calibration.")
@click.option("--repeats", type=LimitedInt("repeats"), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def transfer(device_name, sizes, gpu, profile_file, cpu_file, cpu_profile, repeats, as_json) -> None:
    """n x n products on the CPU (NumPy), on the GPU resident, and on the GPU with copies."""
    import torch

    from nnperf.cli.gpu_options import resolve_targets
    from nnperf.measure.device import resolve_device
    from nnperf.measure.transfer import run_transfer_bench

    n_values = _sizes(sizes)
    if cpu_profile and not cpu_file:
        raise UsageError("--cpu-profile needs --cpu-file (the device description from the same calibration)")
    device = resolve_device(device_name)
    cuda = device if device.type == "cuda" else None
    name = gpu if gpu is not None else (torch.cuda.get_device_name(cuda) if cuda is not None else "h100")
    target = resolve_targets([name], profile_file=profile_file)[0]
    cpu = resolve_targets([], gpu_file=cpu_file, profile_file=cpu_profile)[0] if cpu_file else None
    result = run_transfer_bench(n_values, gpu=target.gpu, profile=target.profile, cuda=cuda,
                                cpu_gpu=cpu.gpu if cpu else None,
                                cpu_profile=cpu.profile if cpu and cpu_profile else None, repeats=repeats)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    from nnperf.report.measure_tables import print_transfer

    print_transfer(result)
