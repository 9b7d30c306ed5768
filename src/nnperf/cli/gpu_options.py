"""The ``--gpu / --gpu-file / --set / --profile`` options every predicting command shares.

One decorator adds them and hands the command a resolved ``GPU`` and ``DeviceProfile``, so
name resolution, user GPU files and what-if overrides behave the same in every command.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu, load_profile
from nnperf.hardware.overrides import parse_set_values

#: The GPU used when neither --gpu nor --gpu-file is given.
DEFAULT_GPU = "h100"


def resolve_gpu(
    gpu: str | None,
    gpu_file: str | Path | None = None,
    set_values: tuple[str, ...] | list[str] = (),
) -> GPU:
    """The GPU a command runs on: by name, from a user file, with what-if overrides applied."""
    if not gpu and gpu_file is None:
        gpu = DEFAULT_GPU
    return load_gpu(gpu, gpu_file=gpu_file, overrides=parse_set_values(list(set_values)) or None)


def resolve_profile(gpu: GPU, profile_file: str | Path | None = None) -> DeviceProfile:
    """The efficiency constants: a measured profile file if given, else generic defaults."""
    return load_profile(profile_file, gpu) if profile_file else default_profile(gpu)


def gpu_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the GPU options; the command receives ``gpu: GPU`` and ``profile: DeviceProfile``."""

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        gpu: str | None,
        gpu_file: str | None,
        set_values: tuple[str, ...],
        profile_file: str | None,
        **kwargs: Any,
    ) -> Any:
        resolved = resolve_gpu(gpu, gpu_file, set_values)
        return fn(*args, gpu=resolved, profile=resolve_profile(resolved, profile_file), **kwargs)

    options = [
        click.option(
            "--gpu",
            "-g",
            "gpu",
            metavar="NAME",
            help=f"GPU name or alias (see 'nnperf gpus'); default {DEFAULT_GPU}, or the "
            "--gpu-file GPU.",
        ),
        click.option(
            "--gpu-file",
            "gpu_file",
            type=click.Path(dir_okay=False),
            help="A TOML file describing one more GPU (same schema as the catalog).",
        ),
        click.option(
            "--set",
            "set_values",
            multiple=True,
            metavar="KEY=VALUE",
            help="What-if change to the GPU, e.g. --set memory_bandwidth_gbs=2000 or "
            "--set peak_tflops.fp32=120 (repeatable).",
        ),
        click.option(
            "--profile",
            "profile_file",
            type=click.Path(dir_okay=False),
            help="A device profile (efficiency constants) measured by calibration.",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
