"""The golden cases: three zoo models through analyze, predict, memory and fit, as --json; and
multi-GPU plans (a tiny Llama on 8 GPUs searched over every axis, a tensor x pipeline case and
an expert-parallel case) and one model's advice (``PLANS``, written before the plan's
restructuring of issue 37).

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
#: A tiny Llama (the zoo's llama-7b, narrowed) on H100s in bf16: cheap to trace on many ranks.
TINY_LLAMA = ("llama-7b", "-O", "dim=256", "-O", "n_heads=4", "-O", "n_kv_heads=4", "-O", "ffn_hidden=512",
              "-O", "vocab=1024", "--seq", "128", "--amp", "bf16", "--gpu", "h100")
#: Whole command lines, by golden file name (``--json`` appended).
PLANS: dict[str, tuple[str, ...]] = {
    "plan-llama-8gpus": ("plan", *TINY_LLAMA, "-O", "n_layer=4", "--gpus", "8"),
    "plan-llama-pipeline": ("plan", *TINY_LLAMA, "-O", "n_layer=4", "--gpus", "8", "--tp", "2", "--pp", "2",
                            "--schedule", "1f1b", "--schedule", "interleaved-1f1b"),
    "plan-llama-experts": ("plan", *TINY_LLAMA, "-O", "n_layer=2", "-O", "n_experts=4", "--gpus", "8",
                           "--ep", "2,4", "--tp", "1", "--pp", "1", "--data", "fsdp"),
    "advise-gpt2": ("advise", "gpt2", "-O", "n_layer=2", "--seq", "128", "--batch", "4", "--amp", "bf16",
                    "--gpu", "h100"),
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


def plan_argv(name: str) -> list[str]:
    return [*PLANS[name], "--json"]


def plan_path(name: str) -> Path:
    return DATA / f"{name}.json"


def regenerate(which: str = "") -> None:
    """Rewrite the golden files whose name starts with ``which`` (all by default)."""
    from click.testing import CliRunner

    from nnperf.cli.app import cli

    runs = [(argv(m, c), path(m, c)) for m, c in cases()] + [(plan_argv(n), plan_path(n)) for n in PLANS]
    for command, file in runs:
        if not file.stem.startswith(which):
            continue
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output
        file.write_text(stable(result.output))
        print("wrote", file)


if __name__ == "__main__":
    import sys

    regenerate(sys.argv[1] if len(sys.argv) > 1 else "")
