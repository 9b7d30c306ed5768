"""The golden cases: three zoo models through analyze, predict, memory and fit, as --json.

The files under data/ were written by the code before the restructuring (issue 14) and keep
every later change honest: a refactor must leave the JSON byte-identical, and a deliberate
change of output (a fixed bug) regenerates them with `python tests/golden/golden_cases.py` in the
same commit, where the diff shows what changed.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data"

MODELS: dict[str, tuple[str, ...]] = {
    "mlp": ("mlp",),
    "resnet18": ("resnet18", "-O", "image_size=64", "--batch", "8"),
    "gpt2": ("gpt2", "-O", "n_layer=2", "--seq", "128", "--batch", "4", "--amp", "bf16"),
}
COMMANDS: dict[str, tuple[str, ...]] = {
    "analyze": (),
    "predict": ("--gpu", "h100"),
    "memory": ("--gpu", "h100"),
    "fit": ("--gpu", "t4"),
}
VOLATILE = {"seconds"}  # wall-clock fields: stripped before comparing


def cases() -> list[tuple[str, str]]:
    return [(model, command) for model in MODELS for command in COMMANDS]


def argv(model: str, command: str) -> list[str]:
    return [command, *MODELS[model], *COMMANDS[command], "--json"]


def stable(text: str) -> str:
    """The JSON document with wall-clock fields removed, as canonical text (a built-in GPU
    file is named by its place in the package, so no machine's paths appear)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in VOLATILE}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(json.loads(text)), indent=1, sort_keys=False) + "\n"


def path(model: str, command: str) -> Path:
    return DATA / f"{model}-{command}.json"


def regenerate() -> None:
    from click.testing import CliRunner

    from nnperf.cli.app import cli

    for model, command in cases():
        result = CliRunner().invoke(cli, argv(model, command))
        assert result.exit_code == 0, result.output
        path(model, command).write_text(stable(result.output))
        print("wrote", path(model, command))


if __name__ == "__main__":
    regenerate()
