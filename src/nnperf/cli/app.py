"""The click group and the one place where user errors become a message and an exit code."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import sys

import click

from nnperf import stopping
from nnperf.errors import NnperfError, UsageError

# Sub-command modules; each defines its command(s) on ``cli`` when imported.
COMMAND_MODULES = [
    "analyze",
    "models",
    "predict",
    "compare",
    "gpus",
    "gemm",
    "report",
    "measure",
    "calibrate",
    "bench",
    "memory",
    "fit",
    "advise",
    "plan",
]


class _Command(click.Command):
    """A sub-command that refuses an empty value where it takes one: ``--layout ''`` would
    otherwise read as no ``--layout`` (a plain measurement of minutes instead of the planned
    layout), ``--cluster ''`` as the default cluster."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for param in self.params:
            if ctx.get_parameter_source(param.name or "") != click.core.ParameterSource.COMMANDLINE:
                continue
            value = ctx.params.get(param.name or "")
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, str) and not v.strip() for v in values):
                label = (param.name or "value").upper() if isinstance(param, click.Argument) else max(param.opts, key=len)
                raise UsageError(f"{label} {value!r} is empty; give a value (see 'nnperf {ctx.info_name} --help')")
        return rest


class _Group(click.Group):
    """Turns every user error into one line on stderr and the documented exit code: nnperf's
    own (``NnperfError``) and click's (an unknown option or command, a missing argument, a
    value outside its choices), which click would print as a usage block."""

    command_class = _Command

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            result = super().invoke(ctx)
        except NnperfError as err:
            click.secho(f"nnperf: error: {err}", fg="red", err=True)
            sys.exit(err.exit_code)
        stopping.check()  # a stop whose exception was lost on the way (``nnperf.stopping``)
        return result

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # type: ignore[override]
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as err:
            click.echo(err.ctx.get_help() if err.ctx else "", err=True)
            sys.exit(err.exit_code)
        except click.UsageError as err:
            # the prefix every other error has; the command's help where the user reads on
            where = err.ctx.command_path if err.ctx else "nnperf"
            click.secho(f"nnperf: error: {err.format_message()} (see '{where} --help')", fg="red", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.secho(f"nnperf: error: {err.format_message()}", fg="red", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.secho("nnperf: aborted", fg="red", err=True)
            sys.exit(130)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nnperf")
def cli() -> None:
    """Predict and measure how fast and how big a PyTorch network is on a GPU."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"nnperf.cli.{_name}")


#: The exit status ``main`` ends with (``_end``).
_exit_code = 0


def _end() -> None:
    """The last thing done at exit (atexit runs the first registered last), once ``finally``
    blocks, atexit handlers and the wait for threads have run: the process ends here, without
    the interpreter's teardown. That teardown walks a traced model's millions of objects and
    runs PyTorch's C++ destructors, seconds on a loaded machine (a CUDA build's, up to tens of
    seconds): a Ctrl-C would take that long to end the process. Memory, files and the device
    go back with the process."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    os._exit(_exit_code)


def main() -> None:
    global _exit_code
    stopping.take_stops()
    atexit.register(_end)
    # The profiler's C++ side (Kineto) prints "USDT ... profiler_start/stop" lines to stderr
    # each time measure/calibrate profile a step; read when the profiler starts. A user's own
    # setting wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        cli()
    except SystemExit as stop:
        _exit_code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        raise
    except KeyboardInterrupt:  # outside click's handling: as Python itself would exit
        _exit_code = 128 + signal.SIGINT
        raise
    except BaseException:
        _exit_code = 1
        raise
