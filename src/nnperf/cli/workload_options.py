"""Options every command that traces a model shares (analyze, predict, memory, measure, ...)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from nnperf.errors import UsageError
from nnperf.request import INPUT_DTYPES, InputSpec, ModelRequest, parse_shape
from nnperf.trace.capture import AMP_DTYPES, DTYPES, OPTIMIZER_IMPLS, OPTIMIZERS, TraceOptions

_WORKLOAD_KEYS = (
    "model", "batch", "seq", "train", "dtype", "amp", "grad_scaler", "optimizer", "optimizer_impl",
    "input_shape", "input_dtype", "tokens", "vocab", "real", "model_opt",
)


def workload_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds MODEL and the options that say which step to trace."""
    options = [
        click.argument("model"),
        click.option("--batch", "-b", type=int, help="Batch size (samples per step)."),
        click.option("--seq", type=int, help="Sequence length for token models."),
        click.option("--train/--inference", default=True, show_default=True,
                     help="A whole training step, or one inference forward."),
        click.option("--dtype", type=click.Choice(list(DTYPES)),
                     help="Cast the model and floating inputs to this dtype."),
        click.option("--amp", type=click.Choice(list(AMP_DTYPES)),
                     help="Mixed precision: autocast to this dtype."),
        click.option("--grad-scaler/--no-grad-scaler", default=None,
                     help="Run torch.amp.GradScaler in the training step (default: with --amp fp16 only)."),
        click.option("--optimizer", type=click.Choice(list(OPTIMIZERS)), default="adamw", show_default=True),
        click.option("--optimizer-impl", type=click.Choice(list(OPTIMIZER_IMPLS)), default="foreach",
                     show_default=True, help="PyTorch optimizer implementation."),
        click.option("--input-shape", multiple=True,
                     help="Input shape for a bare model, e.g. 8,3,224,224 (repeat for several inputs)."),
        click.option("--input-dtype", type=click.Choice(list(INPUT_DTYPES)), default="fp32", show_default=True),
        click.option("--tokens", help="Token-id input B,T for a bare language model."),
        click.option("--vocab", type=int, help="Vocabulary size for --tokens."),
        click.option("--real", is_flag=True,
                     help="Trace on real CPU tensors (for models whose shapes depend on data)."),
        click.option("--model-opt", "-O", multiple=True, metavar="KEY=VALUE",
                     help="Override a built-in model's config, e.g. -O n_layer=2."),
    ]
    for option in reversed(options):
        fn = option(fn)

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        return fn(**kwargs)

    return wrapper


def pop_workload(kwargs: dict[str, Any]) -> tuple[ModelRequest, TraceOptions]:
    """Take the workload options out of a command's arguments: what to build and how to run
    its step, parsed and checked the same way for every command."""
    opts = {k: kwargs.pop(k) for k in _WORKLOAD_KEYS}
    request = ModelRequest(
        opts["model"],
        batch=opts["batch"],
        seq_len=opts["seq"],
        input_spec=_input_spec(opts),
        overrides=parse_model_opts(opts["model_opt"]),
    )
    options = TraceOptions(
        train=opts["train"],
        optimizer=opts["optimizer"],
        optimizer_impl=opts["optimizer_impl"],
        dtype=opts["dtype"],
        amp=opts["amp"],
        grad_scaler=opts["grad_scaler"],
        real=opts["real"],
    )
    return request, options


def _input_spec(opts: dict[str, Any]) -> InputSpec:
    """A bare model's inputs from --input-shape/--input-dtype or --tokens/--vocab."""
    tokens = None
    if opts["tokens"]:
        shape = parse_shape(opts["tokens"])
        if len(shape) != 2:
            raise UsageError(f"invalid --tokens '{opts['tokens']}': expected B,T such as 8,1024")
        tokens = (shape[0], shape[1])
    if opts["vocab"] is not None and opts["vocab"] < 1:
        raise UsageError(f"invalid --vocab {opts['vocab']}: must be a positive integer")
    return InputSpec(
        shapes=tuple(parse_shape(s) for s in opts["input_shape"]),
        dtype=opts["input_dtype"],
        tokens=tokens,
        vocab=opts["vocab"],
    )


def parse_model_opts(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --model-opt '{item}': expected KEY=VALUE such as n_layer=2")
        out[key.strip()] = _literal(value.strip())
    return out


def _literal(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text
