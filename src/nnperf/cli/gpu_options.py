"""The GPU options (``--gpu``/``--gpus``, ``--gpu-file``, ``--set``, ``--profile``) and the one
resolver that turns them into the GPUs a command predicts on.

Every command that names a GPU goes through ``resolve_targets``: names are resolved the same
way, a ``--gpu-file`` GPU can be named among catalog GPUs, and the what-ifs of ``--set`` and
the efficiency constants of ``--profile`` reach every target, not only the first (before,
``report --gpus`` and ``compare`` looked their names up on their own and dropped them). The
decorator offers only the options a command uses: ``memory`` and ``fit`` have no time model,
so no ``--profile``. Renderers get resolved objects and never look a GPU up themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from nnperf.errors import UsageError, shown
from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu, load_profile
from nnperf.hardware.host import Host, load_host, with_host
from nnperf.hardware.overrides import parse_set_values

#: The GPU used when no GPU option is given.
DEFAULT_GPU = "h100"


@dataclass(frozen=True)
class GpuTarget:
    """One GPU to predict on, what-ifs applied, with the profile the time model uses there
    (``None`` for commands without a time model). ``asked``: the name as the user gave it
    (price tables may use it)."""

    gpu: GPU
    profile: DeviceProfile | None
    asked: str | None = None


@dataclass(frozen=True)
class GpuRequest:
    """The GPU options as given, checked but not yet resolved: ``measure`` picks its default
    GPU from the device it runs on, so it resolves later with ``default=``."""

    names: tuple[str, ...] = ()
    gpu_file: str | None = None
    set_values: tuple[str, ...] = ()
    profile_file: str | None = None
    with_profile: bool = True
    host: str | None = None

    @property
    def given(self) -> bool:
        """Whether the user named a GPU (by name or by file)."""
        return bool(self.names) or self.gpu_file is not None

    def resolve(self, default: str | None = DEFAULT_GPU) -> list[GpuTarget]:
        return resolve_targets(self.names, self.gpu_file, self.set_values, self.profile_file,
                               default=default, with_profile=self.with_profile, host=self.host)


def split_gpus(text: str, option: str = "--gpus") -> tuple[str, ...]:
    """'a100, h100' -> ('a100', 'h100'); an empty item is a mistake, not something to skip."""
    items = tuple(item.strip() for item in text.split(","))
    if not any(items):
        raise UsageError(f"{option} {shown(text)} names no GPU; give names such as a100,h100 "
                         "(see 'nnperf gpus')")
    if not all(items):
        raise UsageError(f"{option} {shown(text)} has an empty name between commas; give names "
                         "such as a100,h100")
    return items


def resolve_targets(
    names: Sequence[str] = (),
    gpu_file: str | Path | None = None,
    set_values: Sequence[str] = (),
    profile_file: str | Path | None = None,
    *,
    default: str | None = DEFAULT_GPU,
    with_profile: bool = True,
    host: str | None = None,
) -> list[GpuTarget]:
    """The GPUs named (each by name or as the ``gpu_file`` GPU), with the ``--set`` what-ifs
    applied to every one and the profile (``profile_file`` or the generic defaults) for each,
    its host costs moved to ``host`` (a CPU of ``hardware/hosts.toml``) if one is named.

    No name: the ``gpu_file`` GPU, else ``default``. A ``gpu_file`` that no name refers to is
    refused (it would be read and then ignored), and so is a GPU named twice.
    """
    overrides = parse_set_values(list(set_values)) or None
    for name in names:
        if not name.strip():
            raise UsageError(f"GPU name {shown(name)} is empty; give a name such as h100 "
                             "(see 'nnperf gpus')")
    queries: list[str | None] = list(names)
    if not queries:
        if gpu_file is None and default is None:
            raise UsageError("no GPU given; pass --gpu NAME (see 'nnperf gpus') or --gpu-file")
        queries = [None if gpu_file is not None else default]
    gpus = [load_gpu(q, gpu_file=gpu_file, overrides=overrides) for q in queries]
    if gpu_file is not None and names:
        file_gpu = load_gpu(None, gpu_file=gpu_file)
        if all(g.origin != file_gpu.origin for g in gpus):
            raise UsageError(
                f"--gpu-file {shown(gpu_file)} describes '{file_gpu.id}' ({file_gpu.name}), which "
                f"{'--gpus' if len(names) > 1 else '--gpu'} does not name; add '{file_gpu.id}' "
                "or drop --gpu-file"
            )
    chosen_host = load_host(host) if host is not None else None
    seen: dict[str, str | None] = {}
    for query, gpu in zip(queries, gpus, strict=True):
        if gpu.id in seen:
            raise UsageError(f"GPU '{gpu.id}' is named twice ({seen[gpu.id]} and {query}); "
                             "name each GPU once")
        seen[gpu.id] = query
    return [GpuTarget(g, _profile(g, profile_file, chosen_host) if with_profile else None, q)
            for q, g in zip(queries, gpus, strict=True)]


def _profile(gpu: GPU, profile_file: str | Path | None, host: Host | None = None) -> DeviceProfile:
    """The efficiency constants: a measured profile file if given, else generic defaults;
    with ``host``, its dispatch costs rescaled to that CPU."""
    profile = load_profile(profile_file, gpu) if profile_file is not None else default_profile(gpu)
    if profile_file is not None and profile.gpu and profile.gpu != gpu.id:
        # a measured profile describes the device it was measured on; stderr keeps --json clean
        click.echo(f"note: profile {profile_file} was measured on {profile.gpu}; its constants are "
                   f"used for {gpu.id} as they are (calibrate on that GPU for its own)", err=True)
    return with_host(profile, host) if host is not None else profile


def resolve_gpu(gpu: str | None, gpu_file: str | Path | None = None,
                set_values: Sequence[str] = ()) -> GPU:
    """One GPU, resolved like every command's (``None``: the default or the file's GPU)."""
    names = () if gpu is None else (gpu,)
    return resolve_targets(names, gpu_file, set_values, with_profile=False)[0].gpu


def gpu_options(
    fn: Callable[..., Any] | None = None,
    *,
    profile: bool = True,
    gpu: bool = True,
    gpus: bool = False,
    resolve: bool = True,
) -> Any:
    """Add the GPU options a command can use and hand it resolved objects.

    ``gpu``: offer ``--gpu NAME``; ``gpus``: offer ``--gpus A,B`` (the command then gets
    ``targets: list[GpuTarget]``, otherwise ``gpu: GPU`` and, with ``profile``, ``profile:
    DeviceProfile``). ``profile=False``: no ``--profile`` (no time model). ``resolve=False``:
    the command gets ``gpu_request: GpuRequest`` and resolves it itself.
    """
    if fn is None:
        return functools.partial(gpu_options, profile=profile, gpu=gpu, gpus=gpus, resolve=resolve)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        one = kwargs.pop("gpu_name", None) if gpu else None
        many = kwargs.pop("gpu_names", None) if gpus else None
        if one is not None and many is not None:
            raise UsageError("--gpu and --gpus both name GPUs: give one GPU with --gpu or "
                             "several with --gpus")
        request = GpuRequest(
            names=split_gpus(many) if many is not None else (() if one is None else (one,)),
            gpu_file=kwargs.pop("gpu_file"),
            set_values=tuple(kwargs.pop("set_values")),
            profile_file=kwargs.pop("profile_file", None) if profile else None,
            with_profile=profile,
            host=kwargs.pop("host_name", None) if profile else None,
        )
        if not resolve:
            return fn(*args, gpu_request=request, **kwargs)
        targets = request.resolve()
        if gpus:
            return fn(*args, targets=targets, **kwargs)
        if profile:
            kwargs["profile"] = targets[0].profile
        return fn(*args, gpu=targets[0].gpu, **kwargs)

    options = []
    if gpu:
        options.append(click.option(
            "--gpu", "-g", "gpu_name", metavar="NAME",
            help=f"GPU name or alias (see 'nnperf gpus'); default {DEFAULT_GPU}, or the "
            "--gpu-file GPU."))
    if gpus:
        options.append(click.option(
            "--gpus", "gpu_names", metavar="A,B,...",
            help="Comma-separated GPU names, e.g. v100,a100,h100 (a --gpu-file GPU by its id)."))
    options += [
        click.option(
            "--gpu-file", "gpu_file", type=click.Path(),  # read_toml's one-line errors
            help="A TOML file describing one more GPU (same schema as the catalog)."),
        click.option(
            "--set", "set_values", multiple=True, metavar="KEY=VALUE",
            help="What-if change to every GPU, e.g. --set memory_bandwidth_gbs=2000 or "
            "--set peak_tflops.fp32=120 (repeatable; each key once)."),
    ]
    if profile:
        options.append(click.option(
            "--profile", "profile_file", type=click.Path(),
            help="A device profile (efficiency constants) measured by 'nnperf calibrate', or a "
            "copy of the shipped default_profile.toml."))
        options.append(click.option(
            "--host", "host_name", metavar="CPU",
            help="The host CPU eager PyTorch dispatches from, e.g. epyc-7742 or 'DGX A100' "
            "(hardware/hosts.toml): host costs scale with its single-core clock. Default: "
            "cloud-vm, the virtual machine a rented GPU comes with (measured on nnperf's H200 run: "
            "default_profile.toml), or the host a --profile was calibrated on."))
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper

