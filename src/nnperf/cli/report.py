"""``nnperf report``: a self-contained HTML report, and static roofline images for slides."""

from __future__ import annotations

import click

from nnperf.analysis import analyze_request
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import GpuTarget, gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.cli.paths import check_output, distinct_outputs, write_output
from nnperf.cli.workload_options import cudnn_benchmark_option, pop_workload, workload_options
from nnperf.errors import UsageError, read_user_text


@cli.command()
@workload_options
@gpu_options(gpus=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the HTML report here.")
@click.option("--measured", type=click.Path(dir_okay=False),
              help="Overlay a measured run (the JSON of 'nnperf measure --json').")
@click.option("--png", type=click.Path(dir_okay=False), help="Also write the roofline as a PNG image.")
@click.option("--svg", type=click.Path(dir_okay=False), help="Also write the roofline as an SVG image.")
@click.option("--depth", type=LimitedInt("depth"), default=2, show_default=True,
              help="Module depth of the roofline points and layer bars (one point per layer).")
@click.option("--points", type=click.Choice(["layer", "op"]), default="layer", show_default=True,
              help="Roofline points per layer (module at --depth) or per aten op.")
@click.option("--memory/--no-memory", default=True, show_default=True,
              help="Run the memory model for the memory fit and timeline.")
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="Let fp32 matmuls use TF32 tensor cores.")
@cudnn_benchmark_option
def report(targets: list[GpuTarget], output, measured, png, svg, depth, points, memory, tf32,
           cudnn_benchmark, **kwargs) -> None:
    """Write an HTML report of MODEL on a GPU (or several with --gpus) that opens offline."""
    from nnperf.prediction import predict_analysis, timing_options
    from nnperf.report.html import AUTO, build_compare_report, build_report, load_measured
    from nnperf.report.html.measured import check_comparable

    if not (output or png or svg):
        raise UsageError("nothing to write: give -o report.html, --png FILE or --svg FILE")
    # every output checked before the trace, so a bad path fails in a second, not after it
    outputs = {option: check_output(path, option)
               for option, path in (("--output", output), ("--png", png), ("--svg", svg)) if path}
    distinct_outputs(outputs)
    if measured:
        read_user_text(measured, "measurement file")  # a binary or unreadable file: one line
    overlay = load_measured(measured) if measured else None
    analysis = analyze_request(*pop_workload(kwargs))
    timing = timing_options(tf32, cudnn_benchmark)
    predictions = [predict_analysis(analysis, t.gpu, t.profile, timing) for t in targets]
    if overlay is not None:
        check_comparable(overlay, [p.gpu for p in predictions])
    mem = AUTO if memory else None
    if output:
        if len(predictions) > 1:
            page = build_compare_report(predictions, memory=mem, measured=overlay, depth=depth, by=points)
        else:
            page = build_report(predictions[0], memory=mem, measured=overlay, depth=depth, by=points)
        write_output(outputs["--output"], "--output", lambda p: p.write_text(page, encoding="utf-8"))
        click.echo(f"wrote {output} ({len(page.encode()) / 1024:.0f} KiB)", err=True)
    for option, path, fmt in (("--png", png, "png"), ("--svg", svg, "svg")):
        if path:
            from nnperf.report.roofline import save_roofline

            write_output(outputs[option], option, lambda p, fmt=fmt: save_roofline(
                predictions, p, by=points, depth=depth, fmt=fmt))
            click.echo(f"wrote {path}", err=True)
