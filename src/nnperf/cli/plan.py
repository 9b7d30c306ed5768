"""``nnperf plan MODEL --gpu h100 --gpus N``: data-parallel layouts on N GPUs, ranked."""

from __future__ import annotations

import json
from typing import Any

import click

from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import ResourceError, UsageError
from nnperf.hardware import GPU


@cli.command()
@workload_options
@gpu_options(profile=False)
@click.option("--gpus", "n_gpus", type=click.IntRange(1, 65536), required=True, help="GPUs to lay the step out on.")
@click.option("--nodes-of", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node (default: the cluster's).")
@click.option("--global-batch", type=click.IntRange(1, 1 << 24), default=None,
              help="Samples per optimizer step over all GPUs (default: --batch per GPU).")
@click.option("--cluster", "cluster_name", default=None,
              help="Built-in cluster (dgx-a100, dgx-h100, dgx-h200) or a cluster TOML file.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
def plan(gpu: GPU, n_gpus: int, nodes_of: int | None, global_batch: int | None,
         cluster_name: str | None, as_json: bool, **kwargs: Any) -> None:
    """Rank the data-parallel layouts of MODEL (DDP, FSDP2, HSDP, gradient accumulation) on
    --gpus GPUs: step time, throughput, MFU, per-GPU memory, exposed communication; and a
    torchtitan config and torchrun command for the winner."""
    from nnperf.hardware.cluster import cluster_for_gpu, load_cluster
    from nnperf.search.plan import plan as run_plan
    from nnperf.search.plan import smallest_memory

    cluster = load_cluster(cluster_name) if cluster_name else cluster_for_gpu(gpu.id)
    if cluster is None:
        raise UsageError(f"no built-in cluster of {gpu.name}; give --cluster FILE "
                         "(a copy of hardware/clusters/dgx-h100.toml)")
    nodes = nodes_of or cluster.gpus_per_node
    if n_gpus > nodes and n_gpus % nodes:
        low, high = n_gpus // nodes * nodes, (n_gpus // nodes + 1) * nodes
        raise UsageError(f"--gpus {n_gpus} is not a whole number of {nodes}-GPU nodes; nearest: {low} or {high}")
    request, options = pop_workload(kwargs)
    result = run_plan(request, options, gpu, n_gpus, cluster, nodes, global_batch)
    if as_json:
        doc = result.to_json()
        if result.ranked:
            doc["torchtitan"] = torchtitan_toml(result.ranked[0].execution)
            doc["torchrun"] = torchrun_command(result.ranked[0].execution)
        click.echo(json.dumps(doc, indent=2))
    else:
        _print(result)
    if not result.ranked:
        raise ResourceError(smallest_memory(result))


def torchtitan_toml(execution: Any) -> str:
    """The [parallelism] and [training] tables torchtitan reads for this layout."""
    shard = execution.shard if execution.data != "ddp" else 1
    replicate = execution.replicate if execution.data != "fsdp" else 1
    return "\n".join([
        "[training]",
        f"local_batch_size = {execution.micro_batch * execution.grad_accum}",
        f"global_batch_size = {execution.global_batch}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{"always" if execution.reshard_after_forward else "never"}"',
        "tensor_parallel_degree = 1",
        "pipeline_parallel_degree = 1",
        "context_parallel_degree = 1",
        "",
        "[activation_checkpoint]",
        f'mode = "{execution.checkpoint or "none"}"',
    ])


def torchrun_command(execution: Any) -> str:
    per_node = min(execution.world, execution.gpus_per_node)
    nodes = max(1, execution.world // per_node)
    return (f"torchrun --nnodes={nodes} --nproc_per_node={per_node} --rdzv_backend=c10d "
            "--rdzv_endpoint=$HEAD_NODE:29500 -m torchtitan.train --job.config_file plan.toml")


def _print(result: Any) -> None:
    from nnperf.units import rate

    click.echo(f"{result.model} on {result.gpus} x {result.gpu.name} ({result.cluster.name}), "
               f"global batch {result.global_batch}")
    for i, p in enumerate(result.ranked, 1):
        exposed = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p.split["exposed_communication_s"].items()) or "none"
        click.echo(f"{i}. {p.execution.describe()}: step {p.step_s * 1e3:.2f} ms, "
                   f"{rate(p.throughput, p.throughput_unit)}, MFU {p.mfu:.1%}, "
                   f"{p.memory_bytes / 2**30:.2f} GiB/GPU; compute {p.split['compute_s'] * 1e3:.2f} ms, "
                   f"exposed communication: {exposed}; host {p.split['host_s'] * 1e3:.2f} ms — {p.reason}")
    for p in result.rejected:
        click.echo(f"rejected: {p.execution.describe()}: {p.reason}")
    for note in result.notes:
        click.echo(f"note: {note}")
    if result.ranked:
        click.echo("\ntorchtitan config (plan.toml):\n" + torchtitan_toml(result.ranked[0].execution))
        click.echo("\n" + torchrun_command(result.ranked[0].execution))
