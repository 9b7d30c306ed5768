"""Errors that reach the user as one clear line instead of a traceback.

Exit codes (documented in the README):
  2  usage error: a bad option value (batch, shape, dtype, GPU name, a built-in model's
     -O option or sequence length, ...)
  3  the model could not be loaded (unknown name, missing file, factory raised)
  4  the model cannot be traced on fake tensors (data-dependent shapes), or it fails on
     the inputs it was given (a shape mismatch)
  5  the configuration does not fit (memory) or the device is unavailable
"""

from __future__ import annotations

import os


class NnperfError(Exception):
    """A mistake in what the user asked for; the CLI prints the message and exits."""

    exit_code = 2


class UsageError(NnperfError):
    exit_code = 2


class ModelLoadError(NnperfError):
    exit_code = 3


class ModelOptionError(UsageError):
    """A bad setting of a built-in model (``-O n_layer=abc``, an unknown ``-O`` key, ``--seq``
    on a model without one or above its positions): a usage error, exit 2, not a model that
    could not be loaded."""

    exit_code = 2


class TraceError(NnperfError):
    exit_code = 4


class ResourceError(NnperfError):
    exit_code = 5


def shown(value: object, limit: int = 80) -> str:
    """``value`` quoted for an error line, cut in the middle when long: a 5000-character file
    name must still leave a message of one readable line."""
    text = str(value)
    if len(text) > limit:
        keep = (limit - 5) // 2
        text = f"{text[:keep]}[...]{text[-keep:]}"
    return repr(text)


def read_user_text(path: str | os.PathLike[str], what: str, expected: str = "a file") -> str:
    """The UTF-8 text of a file the user named (a GPU file, a profile, a price table, a
    measurement): missing, a directory, binary or unreadable is one ``UsageError`` naming
    ``what`` and the file, and ``expected`` says what would be valid."""
    name = shown(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise UsageError(f"{what} {name} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {name} is a directory; expected {expected}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {name} is not a text file; expected UTF-8 text ({expected})") from None
    except OSError as err:  # permission, a name too long, an I/O error
        raise UsageError(f"{what} {name} cannot be read: {err.strerror or err}") from None
