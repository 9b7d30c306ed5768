"""Options every command that traces a model shares (analyze, predict, memory, measure, ...)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from nnperf.cli.limits import LimitedInt
from nnperf.errors import UsageError, shown
from nnperf.hub import ATTN_IMPLEMENTATIONS, HF_TASKS
from nnperf.request import INPUT_DTYPES, InputSpec, ModelRequest, parse_shape
from nnperf.trace.options import (
    AMP_DTYPES,
    DTYPES,
    LOSS_MODES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    POINTWISE_MODES,
    SDPA_MODES,
    TraceOptions,
)

_WORKLOAD_KEYS = (
    "model", "batch", "seq", "train", "dtype", "amp", "grad_scaler", "optimizer", "optimizer_impl",
    "input_shape", "input_dtype", "tokens", "vocab", "real", "model_opt", "channels_last",
    "task", "attn_implementation", "moe_load", "moe_capacity_factor", "sdpa",
    "pointwise", "loss", "clip_grad_norm", "fp8",
)


def workload_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds MODEL and the options that say which step to trace."""
    options = [
        click.argument("model"),  # a zoo name, hf:ID, timm:NAME, tv:NAME, PATH.py:FACTORY
        click.option("--batch", "-b", type=LimitedInt("batch"), help="Batch size (samples per step)."),
        click.option("--seq", type=LimitedInt("seq"), help="Sequence length for token models."),
        click.option("--train/--inference", default=True, show_default=True,
                     help="A whole training step, or one inference forward."),
        click.option("--dtype", type=click.Choice(list(DTYPES)),
                     help="Cast the model and floating inputs to this dtype."),
        click.option("--amp", type=click.Choice(list(AMP_DTYPES)),
                     help="Mixed precision: autocast to this dtype."),
        click.option("--grad-scaler/--no-grad-scaler", default=None,
                     help="Run torch.amp.GradScaler in the training step (default: with --amp fp16 only)."),
        click.option("--fp8", is_flag=True,
                     help="FP8 training of the linear layers inside the repeated blocks (with --amp "
                          "bf16), as Transformer Engine runs Megatron-LM's transformer layers "
                          "(--fp8-format hybrid, per-tensor current scaling) and torchao's float8 "
                          "runs torchtitan's: their GEMMs at the FP8 tensor rate, each 16-bit input "
                          "and output gradient scaled and cast first; in Megatron-LM's layouts a "
                          "mixture of experts' grouped GEMMs too (Transformer Engine's GroupedLinear, "
                          "cast expert by expert); the head, embedding, router and attention stay "
                          "16-bit."),
        click.option("--optimizer", type=click.Choice(list(OPTIMIZERS)), default="adamw", show_default=True),
        click.option("--optimizer-impl", type=click.Choice(list(OPTIMIZER_IMPLS)), default="foreach",
                     show_default=True, help="PyTorch optimizer implementation."),
        click.option("--input-shape", multiple=True,
                     help="Input shape for a bare model, e.g. 8,3,224,224 (repeat for several inputs)."),
        click.option("--input-dtype", type=click.Choice(list(INPUT_DTYPES)),
                     help="Dtype of the --input-shape inputs (default fp32); built-in models and "
                          "factories make their own inputs: cast those with --dtype."),
        click.option("--tokens", help="Token-id input B,T for a bare language model."),
        click.option("--vocab", type=LimitedInt("vocab"), help="Vocabulary size for --tokens (default 32000)."),
        click.option("--channels-last", is_flag=True,
                     help="Weights and 4-D inputs in torch.channels_last (NHWC) memory format, as "
                          "model.to(memory_format=torch.channels_last) does (CNNs)."),
        click.option("--real", is_flag=True,
                     help="Trace on real CPU tensors (for models whose shapes depend on data)."),
        click.option("--model-opt", "-O", multiple=True, metavar="KEY=VALUE",
                     help="Override a built-in model's config, e.g. -O n_layer=2 (hf: a config "
                          "field, -O num_hidden_layers=2; timm:/tv: a constructor argument)."),
        click.option("--task", type=click.Choice(list(HF_TASKS)),
                     help="Task head of an hf: model, with its loss (default: the config's "
                          "architecture)."),
        click.option("--attn-implementation", type=click.Choice(list(ATTN_IMPLEMENTATIONS)),
                     help="Attention of an hf: model (default: transformers' choice)."),
        click.option("--sdpa", type=click.Choice(list(SDPA_MODES), case_sensitive=False), default="fused",
                     show_default=True,
                     help="How F.scaled_dot_product_attention runs: one fused kernel (flash or "
                          "memory-efficient, as PyTorch picks), cudnn (cuDNN's fused kernel first where "
                          "it applies: SDPA with cuDNN first in its priority order, and what Transformer "
                          "Engine, so Megatron-Core and NeMo, runs on Hopper), or unfused (GEMM, masked softmax, dropout, GEMM in "
                          "the input's dtype, the score matrix in memory: Megatron-LM's core "
                          "attention before flash attention, GPUs or dtypes no fused kernel serves)."),
        click.option("--pointwise", type=click.Choice(list(POINTWISE_MODES), case_sensitive=False),
                     default="eager", show_default=True,
                     help="How the pointwise, reduction and norm ops inside the model's repeated blocks "
                          "run: one kernel each as written (eager), or fused: those between two GEMMs, "
                          "attention or collectives as one kernel that reads what enters them and "
                          "writes what leaves them, as torch.compile of each block (torchtitan's "
                          "compile) and Transformer Engine / Megatron-Core's fused norm, RoPE, SwiGLU "
                          "and bias-dropout-add kernels run them; refused for a model without "
                          "repeated blocks."),
        click.option("--loss", type=click.Choice(list(LOSS_MODES), case_sensitive=False), default="eager",
                     show_default=True,
                     help="How the loss function runs: as written; compiled (torch.compile(loss_fn), "
                          "torchtitan's compile.components = [\"loss\"]: cross entropy as one fused "
                          "kernel each way, keeping the logits in their dtype instead of an fp32 "
                          "log-softmax); or chunked (torchtitan's chunked loss: the output projection "
                          "and cross entropy over 8 chunks of tokens, each chunk's gradients taken "
                          "at once; built-in decoders), with its inner cross entropy eager as "
                          "torchtitan's default or compiled (chunked-compiled)."),
        click.option("--clip-grad-norm", type=float, metavar="MAX",
                     help="Clip the gradients' global 2-norm to MAX between backward and the "
                          "optimizer step, as torchtitan's clip_grad_norm_ does (Hugging Face's "
                          "Trainer, torchtitan and Megatron-LM clip to 1.0 by default): the norms, "
                          "an all-reduce of sharded ones, one multiply over every gradient."),
        click.option("--moe-load", metavar="S1,S2,...",
                     help="Mixture of experts: each expert's share of the routed tokens, one per "
                          "expert (normalized), assumed where a fake trace cannot know the "
                          "router's choice (default: uniform)."),
        click.option("--moe-capacity-factor", type=float,
                     help="Mixture of experts: the busiest expert gets this many times the mean "
                          "load, the others share the rest evenly (instead of --moe-load)."),
    ]
    for option in reversed(options):
        fn = option(fn)

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        return fn(**kwargs)

    return wrapper


def cudnn_benchmark_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds ``--cudnn-benchmark/--no-cudnn-benchmark``: a library setting of the step, like
    ``--tf32``, that every command predicting or measuring a step takes the same way."""
    return click.option(
        "--cudnn-benchmark/--no-cudnn-benchmark", default=False, show_default=True,
        help="The step runs with torch.backends.cudnn.benchmark on: cuDNN times its "
             "convolution algorithms on each new shape and keeps the fastest (PyTorch's "
             "default is off). measure sets it for its run.")(fn)


def pop_workload(kwargs: dict[str, Any]) -> tuple[ModelRequest, TraceOptions]:
    """Take the workload options out of a command's arguments: what to build and how to run
    its step, parsed and checked the same way for every command."""
    opts = {k: kwargs.pop(k) for k in _WORKLOAD_KEYS}
    if not opts["train"]:
        _refuse_training_options()
    request = ModelRequest(
        opts["model"],
        batch=opts["batch"],
        seq_len=opts["seq"],
        input_spec=_input_spec(opts),
        overrides=parse_model_opts(opts["model_opt"]),
        task=opts["task"],
        attn_implementation=opts["attn_implementation"],
    )
    options = TraceOptions(
        train=opts["train"],
        optimizer=opts["optimizer"],
        optimizer_impl=opts["optimizer_impl"],
        dtype=opts["dtype"],
        amp=opts["amp"],
        grad_scaler=opts["grad_scaler"],
        real=opts["real"],
        channels_last=opts["channels_last"],
        moe_load=parse_moe_load(opts["moe_load"]),
        moe_capacity_factor=opts["moe_capacity_factor"],
        sdpa=opts["sdpa"],
        pointwise=opts["pointwise"],
        loss=opts["loss"],
        clip_grad_norm=opts["clip_grad_norm"],
        fp8=opts["fp8"],
    )
    return request, options


#: Options of the training step: given with --inference they would change nothing.
_TRAINING_OPTIONS = {"optimizer": "--optimizer", "optimizer_impl": "--optimizer-impl",
                     "grad_scaler": "--grad-scaler/--no-grad-scaler", "loss": "--loss",
                     "clip_grad_norm": "--clip-grad-norm"}


def _refuse_training_options() -> None:
    """An optimizer, GradScaler or loss option the user typed beside --inference is refused (it
    would be dropped silently: an inference step runs no optimizer and no loss); their defaults
    are fine."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    given = [flag for name, flag in _TRAINING_OPTIONS.items()
             if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
    if given:
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a training step; "
                         "--inference runs the forward only (leave them out, or drop --inference)")


def parse_moe_load(text: str | None) -> tuple[float, ...] | None:
    """``--moe-load 0.4,0.2,0.2,0.2``: one share per expert."""
    if text is None:
        return None
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            f"invalid --moe-load {shown(text)}: expected comma-separated shares, one per expert, "
            "e.g. 0.4,0.2,0.2,0.2"
        ) from None


def _input_spec(opts: dict[str, Any]) -> InputSpec:
    """A bare model's inputs from --input-shape/--input-dtype or --tokens/--vocab.

    A setting that would not reach any input is refused, never dropped: --input-dtype types
    only --input-shape inputs (a built-in model or a factory makes its own: a user who asks
    for fp16 inputs there wants the model in fp16, which is --dtype), --vocab only --tokens.
    """
    tokens = None
    if opts["tokens"] is not None:
        shape = parse_shape(opts["tokens"], "--tokens")
        if len(shape) != 2:
            raise UsageError(f"invalid --tokens {shown(opts['tokens'])}: expected B,T such as 8,1024")
        tokens = (shape[0], shape[1])
        if opts["input_shape"]:
            raise UsageError("--tokens and --input-shape both give the inputs: choose one")
    if opts["vocab"] is not None and tokens is None:
        raise UsageError(f"--vocab {opts['vocab']} is not used: it sizes the token ids of "
                         "--tokens B,T; give --tokens too, or drop --vocab")
    dtype = opts["input_dtype"]
    if dtype is not None and not opts["input_shape"]:
        raise UsageError(
            f"--input-dtype {dtype} is not used: it types the inputs of --input-shape only "
            + ("(token ids are int64)" if tokens else "(built-in models and factories make their "
               "own inputs)")
            + "; to run the model and its floating inputs in that dtype use --dtype, for "
              "mixed precision --amp"
        )
    return InputSpec(
        shapes=tuple(parse_shape(s, "--input-shape") for s in opts["input_shape"]),
        dtype=dtype or "fp32",
        tokens=tokens,
        vocab=opts["vocab"],
    )


def parse_model_opts(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --model-opt '{item}': expected KEY=VALUE such as n_layer=2")
        out[key.strip()] = _literal(value.strip(), item)
    return out


def _literal(text: str, item: str) -> Any:
    """The value of ``-O KEY=VALUE``: an integer, a finite number, true/false, else the text
    (the model's own options check it against the field's type and range)."""
    for cast in (int, float):
        try:
            number = cast(text)
        except ValueError:
            continue
        if not math.isfinite(number):
            raise UsageError(f"invalid --model-opt '{item}': {text} is not a finite number")
        return number
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text
