"""The torchtitan config function a plan writes, run against stand-ins of torchtitan's config
classes whose fields are the real ones (``data/torchtitan_config_fields.json``, read from
torchtitan's configs.py at the commit the writer names): every field it sets exists, and the
values are the layout's, worked out here from the layout."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from nnperf.layout import Execution
from nnperf.report.engine_configs import NotExpressible
from nnperf.report.torchtitan_python import FUNCTION, torchrun_python_command, torchtitan_python

FIELDS = json.loads((Path(__file__).parent / "data" / "torchtitan_config_fields.json").read_text())


class _Section:
    """A config dataclass that takes only its real fields."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __setattr__(self, key: str, value: object) -> None:
        if key not in FIELDS[self._name]:
            raise AttributeError(f"{self._name} has no field {key!r}")
        object.__setattr__(self, key, value)


class _FullAC:
    class Config:
        pass


class _SelectiveAC:
    class Config:
        pass


class _Chunked:
    class Config:
        def __init__(self, loss_fn: object = None, num_chunks: int = 8) -> None:
            self.loss_fn, self.num_chunks = loss_fn, num_chunks


def _base() -> types.SimpleNamespace:
    """A shipped config: torchtitan's llama3_8b chunks its cross entropy."""
    return types.SimpleNamespace(training=_Section("TrainingConfig"), parallelism=_Section("ParallelismConfig"),
                                 compile=_Section("CompileConfig"), activation_checkpoint=_SelectiveAC.Config(),
                                 loss=_Chunked.Config(loss_fn="cross-entropy"))


@pytest.fixture
def torchtitan(monkeypatch):
    modules = {
        "torchtitan": {}, "torchtitan.components": {}, "torchtitan.distributed": {}, "torchtitan.models": {},
        "torchtitan.models.llama3": {},
        "torchtitan.components.loss": {"ChunkedLossWrapper": _Chunked},
        "torchtitan.distributed.activation_checkpoint": {"FullAC": _FullAC, "SelectiveAC": _SelectiveAC},
        "torchtitan.trainer": {"Trainer": types.SimpleNamespace(Config=object)},
        "torchtitan.models.llama3.config_registry": {"llama3_8b": _base},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


def _run(text: str) -> types.SimpleNamespace:
    scope: dict[str, object] = {}
    exec(compile(text, "nnperf_plan.py", "exec"), scope)  # the generated config, on stand-ins
    return scope[FUNCTION]()


def test_a_pipeline_with_tensor_parallelism(torchtitan):
    """HSDP 4 x 2, TP 2 with SP, interleaved 1F1B over 2 stages, 8 micro-batches of 2 sequences of
    4096 tokens, full checkpointing, loss chunked: 64 GPUs."""
    e = Execution(world=64, data="hsdp", shard=2, tensor=2, sequence_parallel=True, pipeline=2,
                  pipeline_schedule="interleaved-1f1b", virtual_stages=2, micro_batch=2, grad_accum=8,
                  checkpoint="full", reshard_after_forward=False)
    config = _run(torchtitan_python(e, "llama-7b", 4096, amp="bf16", loss="chunked"))
    dp = 64 // (2 * 2)  # 16 data-parallel ranks: 8 replicas of 2 shards
    assert config.training.num_tokens_per_microbatch_per_dp_rank == 2 * 4096
    assert config.training.num_tokens_per_train_step == dp * 8 * 2 * 4096
    assert (config.parallelism.data_parallel_replicate_degree, config.parallelism.data_parallel_shard_degree) == (8, 2)
    assert config.parallelism.tensor_parallel_degree == 2 and config.parallelism.enable_sequence_parallel is True
    assert config.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    assert config.parallelism.num_pp_microbatches == 8
    assert config.parallelism.fsdp_reshard_after_forward == "never"
    assert config.parallelism.spmd_backend == "partial_dtensor"
    assert isinstance(config.activation_checkpoint, _FullAC.Config)
    assert isinstance(config.loss, _Chunked.Config) and config.loss.loss_fn == "cross-entropy"
    assert config.compile.enable is False


def test_fsdp_without_checkpointing_unchunks_the_loss_and_compiles_it(torchtitan):
    e = Execution(world=16, data="fsdp", shard=16, micro_batch=1, grad_accum=4)
    config = _run(torchtitan_python(e, "llama-7b", 2048, amp=None, loss="compiled"))
    assert config.training.num_tokens_per_train_step == 16 * 4 * 2048
    assert config.training.mixed_precision_param == "float32"
    assert config.activation_checkpoint is None
    assert config.loss == "cross-entropy"  # the base's chunked wrapper taken off: the plan's loss is one call
    assert config.compile.enable is True and config.compile.components == ["loss"]
    assert not hasattr(config.parallelism, "num_pp_microbatches")
    assert not hasattr(config.parallelism, "spmd_backend")


def test_clipping_sets_torchtitans_max_norm(torchtitan):
    e = Execution(world=16, data="fsdp", shard=16, micro_batch=1, grad_accum=4)
    assert _run(torchtitan_python(e, "llama-7b", 2048, amp="bf16", clip=0.25)).training.max_norm == 0.25
    unclipped = torchtitan_python(e, "llama-7b", 2048, amp="bf16")
    assert not hasattr(_run(unclipped).training, "max_norm")  # torchtitan's own 1.0 stands, and a comment says so
    assert "torchtitan clips the gradients every step (default 1.0)" in unclipped


def test_what_torchtitan_cannot_run_is_refused():
    e = Execution(world=8, data="fsdp", shard=8, micro_batch=1, checkpoint="selective-attention")
    with pytest.raises(NotExpressible, match="attention-only"):
        torchtitan_python(e, "llama-7b", 2048, amp="bf16")
    with pytest.raises(NotExpressible, match="sequence length"):
        torchtitan_python(Execution(world=8, data="fsdp", shard=8, micro_batch=1), "llama-7b", None, amp="bf16")
    with pytest.raises(NotExpressible, match="no ZeRO-1"):
        torchtitan_python(Execution(world=8, data="zero1", micro_batch=1), "llama-7b", 2048, amp="bf16")


def test_the_torchrun_command_names_the_function():
    e = Execution(world=32, data="fsdp", shard=32, micro_batch=1)
    assert torchrun_python_command(e).startswith("torchrun --nnodes=4 --nproc_per_node=8")
    assert torchrun_python_command(e).endswith("--module nnperf_plan --config nnperf_plan")


def test_per_op_checkpointing_is_torchtitans_selective_policy(torchtitan):
    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2, checkpoint="selective-op")
    assert isinstance(_run(torchtitan_python(e, "llama-7b", 8192, amp="bf16")).activation_checkpoint,
                      _SelectiveAC.Config)


def test_async_tensor_parallelism_is_a_compile_setting(torchtitan):
    """torchtitan's CompileConfig holds enable_async_tensor_parallel and refuses it without the
    compiled model (its ``__post_init__``): set beside compile's model component, refused
    without it."""
    e = Execution(world=16, data="fsdp", shard=2, tensor=8, sequence_parallel=True, micro_batch=1, async_tp=True)
    config = _run(torchtitan_python(e, "llama-7b", 2048, amp="bf16", pointwise="fused"))
    assert config.compile.enable is True and "model" in config.compile.components
    assert config.compile.enable_async_tensor_parallel is True
    with pytest.raises(NotExpressible, match="compiled model only"):
        torchtitan_python(e, "llama-7b", 2048, amp="bf16", loss="compiled")
