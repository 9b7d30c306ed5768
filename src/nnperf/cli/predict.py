"""``nnperf predict``: predicted time of one step on a GPU, per module and op, and why."""

from __future__ import annotations

import json

import click

from nnperf.analysis import analyze_request
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.cli.paths import check_output, write_output
from nnperf.cli.workload_options import cudnn_benchmark_option, pop_workload, workload_options


@cli.command()
@workload_options
@gpu_options
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="Let fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32).")
@cudnn_benchmark_option
@click.option("--by", type=click.Choice(["module", "op"]), default="module", show_default=True,
              help="Rows of the time table: modules (to --depth) or aten ops.")
@click.option("--depth", type=LimitedInt("depth"), default=2, show_default=True,
              help="Module tree depth shown (0: the whole model only).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document (analysis + timing).")
@click.option("--trace-out", type=click.Path(dir_okay=False),
              help="Write the predicted timeline (host dispatch and device kernels) as a Chrome "
              "trace for Perfetto.")
def predict(gpu, profile, tf32, cudnn_benchmark, by, depth, as_json, trace_out, **kwargs) -> None:
    """Predict how long one step of MODEL takes on a GPU, and what bounds each layer."""
    from nnperf.prediction import predict_analysis, timing_options

    if trace_out:
        trace_out = check_output(trace_out, "--trace-out")  # before the work, not after it
    analysis = analyze_request(*pop_workload(kwargs))
    result = predict_analysis(analysis, gpu, profile, timing_options(tf32, cudnn_benchmark))
    if trace_out:
        from nnperf.report.chrome_trace import write_chrome_trace

        write_output(trace_out, "--trace-out", lambda p: write_chrome_trace(result, p))
        click.echo(f"wrote {trace_out}", err=True)  # stderr: keeps --json output parseable
    if as_json:
        click.echo(json.dumps(result.to_json(depth=depth), indent=2))
        return
    from nnperf.report.prediction_tables import print_prediction

    print_prediction(result, by=by, depth=depth)
