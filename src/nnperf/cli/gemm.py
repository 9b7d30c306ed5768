"""``nnperf gemm M N K``: one GEMM (or a sweep of sizes) explained the way NVIDIA's guide does."""

from __future__ import annotations

import json

import click
from rich.table import Table

from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.errors import UsageError
from nnperf.hardware import GPU, DeviceProfile
from nnperf.kernels.gemm import GEMV_TILE, GemmEstimate, estimate_gemm, tile_text
from nnperf.report.console import make_console
from nnperf.units import binary, seconds, si

#: A sweep longer than this is almost certainly a typo in STEP.
MAX_SWEEP_ROWS = 5000


def parse_sweep(spec: str) -> tuple[str, list[int]]:
    """'k:1024:8192:128' -> ('k', [1024, 1152, ..., 8192]); dims may combine, e.g. 'mnk'."""
    parts = spec.split(":")
    dims = parts[0].strip().lower()
    bad = f"--sweep {spec!r}: expected DIMS:START:STOP:STEP with DIMS from m, n, k (e.g. k:1024:8192:128 or mnk:512:8192:256) and positive integers, START <= STOP"
    if len(parts) != 4 or not dims or set(dims) - set("mnk") or len(set(dims)) != len(dims):
        raise UsageError(bad)
    try:
        start, stop, step = (int(p) for p in parts[1:])
    except ValueError:
        raise UsageError(bad) from None
    if start <= 0 or step <= 0 or stop < start:
        raise UsageError(bad)
    # Counted before any list is made: k:1024:1000000000:1 would otherwise build (and then
    # estimate) a billion rows before the cap below was ever checked.
    count = (stop - start) // step + 1
    if count > MAX_SWEEP_ROWS:
        raise UsageError(
            f"--sweep {spec!r} gives {count:,} sizes; at most {MAX_SWEEP_ROWS:,}: "
            "use a larger STEP or a narrower START:STOP"
        )
    return dims, list(range(start, stop + 1, step))


def _tiling_rows(e: GemmEstimate, sm_count: int) -> list[tuple[str, str]]:
    """Tile and wave quantization rows; a GEMV kernel has neither, and says so."""
    if e.tile == GEMV_TILE:
        return [("CTA tile", "none: a matrix-vector product runs as a GEMV kernel, one pass over "
                 "the matrix, no output tiles to pad or waves to fill")]
    tm, tn = e.tile
    return [
        ("CTA tile", f"{tm}x{tn} (relative efficiency {e.tile_relative_efficiency:.2f})"
         + (f", split-K {e.split_k}" if e.split_k > 1 else "")),
        ("CTAs / waves", f"{e.ctas} CTAs on {sm_count} SMs -> {e.waves} wave" + ("s" if e.waves > 1 else "")),
        ("tile efficiency", f"{_pct(e.tile_efficiency)} = M*N / (ceil(M/{tm})*{tm} * ceil(N/{tn})*{tn})"),
        ("wave efficiency", f"{_pct(e.wave_efficiency)} = CTAs / (waves * SMs)"),
    ]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _integer(dtype: str) -> bool:
    """Integer math is counted in operations (TOPS), as the datasheets quote it, not FLOPs."""
    return dtype.startswith(("int", "uint"))


def _work(value: float, dtype: str) -> str:
    """'2 kFLOP' for floating point, '2 k ops' for integer math (op = 2 x MAC likewise)."""
    return f"{si(value)} ops" if _integer(dtype) else si(value, "FLOP")


def _rate(value: float, dtype: str) -> str:
    """'989 TFLOP/s' for floating point; integer math in TOPS as datasheets quote it
    ('1,979 TOPS', not '1.98 POPS'), smaller rates with their own prefix ('539 kOPS')."""
    if not _integer(dtype):
        return si(value, "FLOP/s")
    return f"{value / 1e12:,.0f} TOPS" if value >= 1e15 else si(value, "OPS")


def _explain(e: GemmEstimate, gpu: GPU) -> Table:
    what_if = f"; what-if {', '.join(gpu.overrides)}" if gpu.overrides else ""
    t = Table(
        title=f"GEMM M={e.m} N={e.n} K={e.k} batch={e.batch} {e.dtype} on {gpu.label} "
        f"({gpu.id}{what_if})",
        title_justify="left",
        show_header=False,
    )
    t.add_column("what", style="bold")
    t.add_column("value")
    unit = "tensor cores" if e.math_unit == "tensor" else "CUDA cores"
    op = "op" if _integer(e.dtype) else "FLOP"
    rows = [
        ("work", f"{_work(e.flops, e.dtype)} ({op} = 2 x MAC: {si(e.flops / 2, 'MAC')})"),
        ("minimum bytes", f"{binary(e.min_bytes)} (each operand read once, output written once)"),
        (
            "arithmetic intensity",
            f"{e.intensity:.1f} {op}/B vs ridge point {e.ridge:.1f} {op}/B "
            f"-> {'above: compute-bound' if e.intensity >= e.ridge else 'below: memory-bound'} "
            "on the roofline",
        ),
        (
            "math unit",
            f"{unit}, {e.rate_dtype} peak {_rate(e.peak_flops, e.dtype)}; achievable "
            f"fraction {e.math_fraction:.2f}",
        ),
        *_tiling_rows(e, gpu.sm_count),
        (
            "alignment",
            ("aligned: " if e.aligned else "MISALIGNED: ")
            + e.alignment_note
            + (f" (efficiency x{e.alignment_factor:g})" if e.alignment_factor != 1 else ""),
        ),
        (
            "roofline",
            f"compute {seconds(e.compute_s)} ({op} / peak), memory "
            f"{seconds(e.memory_s)} (bytes / datasheet bandwidth)",
        ),
        (
            "model",
            f"compute {seconds(e.model_compute_s)}, memory {seconds(e.model_memory_s)}"
            + (f", split-K reduction {seconds(e.reduction_s)}" if e.reduction_s else "")
            + f", kernel overhead {seconds(e.overhead_s)} -> {e.bound}-bound",
        ),
        (
            "predicted",
            f"{seconds(e.time_s)} = {_rate(e.achieved_flops, e.dtype)} "
            f"({_pct(e.achieved_flops / e.peak_flops)} of {e.rate_dtype} peak)",
        ),
    ]
    if e.note:
        rows.append(("note", e.note))
    for row in rows:
        t.add_row(*row)
    return t


def _sweep_table(estimates: list[GemmEstimate], dims: str, gpu: GPU) -> Table:
    e0 = estimates[0]
    rate_col, op = ("TOPS", "op") if _integer(e0.dtype) else ("TFLOP/s", "FLOP")
    t = Table(
        title=f"GEMM sweep over {'='.join(dims.upper())} ({e0.dtype} on {gpu.id}, "
        f"{gpu.sm_count} SMs; {rate_col} counts {op} = 2 x MAC; v = drop)",
        title_justify="left",
    )
    for col in (
        "M",
        "N",
        "K",
        "tile",
        "CTAs",
        "waves",
        "tile eff",
        "wave eff",
        "split-K",
        "aligned",
        "bound",
        "time",
        rate_col,
        "",
    ):
        t.add_column(col, justify="right")
    prev = None
    for e in estimates:
        tflops = e.achieved_flops / 1e12
        t.add_row(
            str(e.m),
            str(e.n),
            str(e.k),
            tile_text(e.tile),
            str(e.ctas),
            str(e.waves),
            _pct(e.tile_efficiency),
            _pct(e.wave_efficiency),
            str(e.split_k),
            "yes" if e.aligned else "NO",
            e.bound,
            seconds(e.time_s),
            f"{tflops:.1f}",
            "v" if prev is not None and tflops < prev else "",
        )
        prev = tflops
    return t


@cli.command()
@click.argument("m", type=LimitedInt("gemm_dim"))
@click.argument("n", type=LimitedInt("gemm_dim"))
@click.argument("k", type=LimitedInt("gemm_dim"))
@click.option(
    "--batch",
    "-b",
    type=LimitedInt("gemm_batch"),
    default=1,
    show_default=True,
    help="Number of independent GEMMs (batched matmul).",
)
@click.option(
    "--dtype",
    "-d",
    default="bf16",
    show_default=True,
    help="fp64, fp32, tf32, fp16, bf16, fp8 or int8.",
)
@click.option("--tf32", is_flag=True, help="Let fp32 use TF32 tensor cores (Ampere and later).")
@click.option(
    "--sweep",
    metavar="DIMS:START:STOP:STEP",
    help="Vary m, n and/or k (e.g. k:1024:8192:128, mnk:512:8192:128), one row each; "
    "swept dimensions replace the M N K given.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@gpu_options
def gemm(
    m: int,
    n: int,
    k: int,
    batch: int,
    dtype: str,
    tf32: bool,
    sweep: str | None,
    as_json: bool,
    gpu: GPU,
    profile: DeviceProfile,
) -> None:
    """Predict one GEMM C[M,N] = A[M,K] @ B[K,N]: tiles, waves, alignment, roofline, time."""
    if sweep:
        dims, sizes = parse_sweep(sweep)
        shapes = []
        for size in sizes:
            shape = {"m": m, "n": n, "k": k} | dict.fromkeys(dims, size)
            shapes.append((shape["m"], shape["n"], shape["k"]))
    else:
        dims, shapes = "", [(m, n, k)]
    estimates = [
        estimate_gemm(*s, batch=batch, dtype=dtype, gpu=gpu, profile=profile, tf32=tf32)
        for s in shapes
    ]
    if as_json:
        payload = [e.to_dict() for e in estimates]
        click.echo(json.dumps(payload if sweep else payload[0], indent=2))
    elif sweep:
        make_console().print(_sweep_table(estimates, dims, gpu))
    else:
        make_console().print(_explain(estimates[0], gpu))
