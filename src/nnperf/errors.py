"""Errors that reach the user as one clear line instead of a traceback.

Exit codes (documented in the README):
  2  usage error: a bad option value (batch, shape, dtype, GPU name, ...)
  3  the model could not be loaded (unknown name, missing file, factory raised)
  4  the model cannot be traced on fake tensors (data-dependent shapes)
  5  the configuration does not fit (memory) or the device is unavailable
"""

from __future__ import annotations


class NnperfError(Exception):
    """A mistake in what the user asked for; the CLI prints the message and exits."""

    exit_code = 2


class UsageError(NnperfError):
    exit_code = 2


class ModelLoadError(NnperfError):
    exit_code = 3


class TraceError(NnperfError):
    exit_code = 4


class ResourceError(NnperfError):
    exit_code = 5
