"""The framework a search plans its layouts as (``nnperf plan --framework``).

Megatron-LM and torch (as torchtitan composes it) both run tensor, pipeline and context
parallelism with data parallelism over one rank, and model it differently: Megatron-LM's
tensor-parallel layers and vocabulary-parallel loss against DTensor's, its pipeline schedules,
which free a sent output and receive a gradient as it arrives, against
``torch.distributed.pipelining``'s, which keep both for every micro-batch
(``search.plan.pipeline``). Without a choice such a layout is planned as torch's and the layouts
only Megatron-LM runs as Megatron-LM's (``Execution.megatron_layout``); with one, every layout is
planned as that framework runs it and those it does not run are left out.
"""

from __future__ import annotations

from nnperf.errors import UsageError
from nnperf.layout import FRAMEWORKS, Execution

#: The data-parallel engines each framework runs: Megatron-LM's DDP and distributed optimizer;
#: torch's DDP (alone), FSDP2 and HSDP.
FRAMEWORK_ENGINES = {"megatron": ("ddp", "zero1"), "torch": ("ddp", "fsdp", "hsdp")}


def framework_kinds(framework: str, kinds: set[str], asked: bool, megatron_settings: list[str],
                    experts_beside_tensor: bool) -> set[str]:
    """The data-parallel engines of ``kinds`` that ``framework`` runs. One line where none is
    left of those the user asked for (``asked``), where torch is asked for beside one of
    Megatron-LM's own settings (``megatron_settings``: their flags), or beside a mixture of
    experts with tensor parallelism (which only Megatron-Core's expert layers split)."""
    if framework not in FRAMEWORKS:
        raise UsageError(f"invalid --framework {framework!r}; valid: auto, {', '.join(FRAMEWORKS)}")
    runs = FRAMEWORK_ENGINES[framework]
    kept = {k for k in kinds if k in runs}
    if asked and not kept:
        raise UsageError(f"--framework {framework} runs {', '.join(runs)} data parallelism: --data "
                         f"{','.join(sorted(kinds))} has none of them")
    if framework == "torch" and megatron_settings:
        raise UsageError(f"--framework torch with {', '.join(megatron_settings)}: Megatron-LM's own settings; "
                         "give --framework megatron or auto, or drop them")
    if framework == "torch" and experts_beside_tensor:
        raise UsageError("--framework torch with --tp above 1 for a mixture of experts: its expert layers are "
                         "planned beside tensor parallelism as Megatron-Core splits them; give --framework "
                         "megatron or auto, or --tp 1")
    return kept


def runs_layout(framework: str | None, execution: Execution) -> bool:
    """Whether ``framework`` (None: the one the layout implies) runs ``execution``
    (``Execution.refusal_by``)."""
    return framework is None or execution.refusal_by(framework) is None
