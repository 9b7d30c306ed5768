"""``python -m nnperf``: the CLI, so a launcher can start it as a module (``torchrun -m nnperf
measure ... --layout PLAN.json``)."""

from nnperf.cli import main

if __name__ == "__main__":
    main()
