"""The fork server's first import (``fit_parallel.FORKSERVER_PRELOAD``), before the seconds of
its preload (``fit_server``): the server dies with the process that started it, at once, not
once its preload is done and it reads that its parent is gone. (It takes no Ctrl-C: it starts
with the stop signals held, ``fit_parallel._context``.)"""

from __future__ import annotations

from nnperf import stopping

stopping.die_with_parent()
