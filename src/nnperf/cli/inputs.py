"""Input files the commands read (price tables, measurements): one way to read them, so a
missing, unreadable or binary file is one line naming the option's file, never a traceback.

(GPU files and profiles go through ``nnperf.hardware.schema.read_toml``, which does the same.)
"""

from __future__ import annotations

import os

from nnperf.errors import UsageError, shown


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` names the file in errors ('price file')."""
    name = shown(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise UsageError(f"{what} {name} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {name} is a directory; expected a file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {name} is not a text file; expected UTF-8 text") from None
    except OSError as err:  # permission, a name too long, an I/O error
        raise UsageError(f"{what} {name} cannot be read: {err.strerror or err}") from None
