"""A trace never uses real memory or runs away: fused optimizers trace without running their
kernels for real, an op with no fake kernel runs for real only on small inputs, and sizes
beyond what this machine can trace are refused in one line naming the limit."""

from __future__ import annotations

import pytest
import torch
import torch._subclasses.fake_tensor as fake_tensor
from click.testing import CliRunner
from torch import nn

from nnperf.analysis import analyze
from nnperf.cli.app import cli
from nnperf.errors import UsageError
from nnperf.trace import limits
from nnperf.trace.events import KIND_OPT_STATE
from nnperf.trace.routing import TraceFakeMode


@pytest.fixture
def fallbacks(monkeypatch) -> list[str]:
    """The ops PyTorch's fake mode ran for real (its fallback kernel), by name."""
    ran: list[str] = []
    original = fake_tensor.run_fallback_kernel

    def spy(mode, func, *args, **kwargs):
        ran.append(str(func))
        return original(mode, func, *args, **kwargs)

    monkeypatch.setattr(fake_tensor, "run_fallback_kernel", spy)
    return ran


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum", "adamw"])
def test_fused_optimizers_trace_without_running_a_kernel_for_real(fallbacks, optimizer):
    """``_fused_sgd_`` has no fake kernel: PyTorch's fake mode ran it on real zero-filled copies
    of every parameter, gradient and momentum buffer (12.9 GB of host memory for gpt2-xl)."""
    model = _mlp()
    a = analyze(model, inputs=(torch.randn(4, 32),), optimizer=optimizer, optimizer_impl="fused")
    assert fallbacks == []
    name = "aten._fused_sgd_" if optimizer.startswith("sgd") else "aten._fused_adamw_"
    assert [e.name for e in a.trace.events if e.name.startswith("aten._fused")] == [name]
    params = sum(p.numel() for p in model.parameters())
    states = {"sgd": 0, "sgd-momentum": 1, "adamw": 2}[optimizer]  # momentum; exp_avg, exp_avg_sq
    state_bytes = sum(s.nbytes for s in a.trace.storages.values() if s.kind == KIND_OPT_STATE and s.nbytes > 4)
    assert state_bytes == states * params * 4


def _adagrad(n: int) -> None:
    """``_fused_adagrad_`` (not an optimizer nnperf builds) has no fake kernel either."""
    p, g, s, step = torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.zeros(())
    torch._fused_adagrad_([p], [g], [s], [step], lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
                          maximize=False)


def test_an_op_without_a_fake_kernel_runs_for_real_on_small_inputs_only(fallbacks):
    with TraceFakeMode(allow_non_fake_inputs=True):
        _adagrad(16)  # 4 x 64 bytes of zeros: allowed
        assert fallbacks == ["aten._fused_adagrad_.default"]
        n = limits.FALLBACK_BYTES // 4 // 3 + 1  # three fp32 lists just over the limit
        with pytest.raises(UsageError, match=r"aten\._fused_adagrad_\.default has no fake-tensor kernel .* "
                                             r"on 64 MiB of zeros \(a trace allows 64 MiB\)"):
            _adagrad(n)
    assert fallbacks == ["aten._fused_adagrad_.default"]  # the large one never ran


def test_a_layer_count_beyond_this_machine_is_refused_before_building():
    limit = limits.max_modules()
    assert limit == int(limits.host_memory_bytes() * 0.25) // (45 * 1024)
    with pytest.raises(UsageError, match=rf"gpt2: n_layer={limit + 1:,} is more than this machine can trace: .* "
                                         rf"at most {limit:,} modules here"):
        analyze("gpt2", n_layer=limit + 1)
    # a value no integer option takes is refused where -O is parsed (nnperf.fields), before any limit
    with pytest.raises(UsageError, match=r"gpt2: n_layer must be an integer from .* to 2,147,483,647, got 1e\+30"):
        analyze("gpt2", n_layer=1e30)


def test_a_hugging_face_config_counts_layers_and_experts_nested_or_not():
    limits.check_counts({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 10**9, "rope_theta": 1e12},
                        "hf:x")
    with pytest.raises(UsageError, match=r"hf:x: hidden_size=1,000,000,000,000 is too large; every size is at most "
                                         r"2\*\*31 - 1"):
        limits.check_counts({"hidden_size": "1000000000000"}, "hf:x")  # -O hidden_size=1000000000000
    with pytest.raises(UsageError, match=r"hf:x: num_hidden_layers=1,000,000,000 is more than this machine"):
        limits.check_counts({"model_type": "llama", "num_hidden_layers": 1_000_000_000}, "hf:x")
    with pytest.raises(UsageError, match=r"hf:x: n_routed_experts=10,000,000 is more"):
        limits.check_counts({"text_config": {"n_routed_experts": "1e7"}}, "hf:x")


def test_a_build_is_stopped_where_it_crosses_the_module_limit(monkeypatch):
    monkeypatch.setattr(limits, "max_modules", lambda: 50)
    a = analyze("gpt2", n_layer=1, n_embd=32, n_head=2, vocab=64, seq_len=8, batch=1)  # under 50 modules
    assert a.totals["params"] > 0
    with pytest.raises(limits.TooManyModules, match="gpt2 builds more than 50 modules"):
        analyze("gpt2", n_layer=10, n_embd=32, n_head=2, vocab=64, seq_len=8, batch=1)


def test_a_trace_is_stopped_at_the_op_limit(monkeypatch):
    monkeypatch.setattr(limits, "max_traced_ops", lambda: 20)
    with pytest.raises(UsageError, match="the step records more than 20 ops, more than this machine can trace"):
        analyze(_mlp(), inputs=(torch.randn(4, 32),))


def test_the_cli_refuses_in_one_line():
    result = CliRunner().invoke(cli, ["analyze", "gpt2", "-O", "n_layer=1e30"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "n_layer must be an integer" in result.output and "1e+30" in result.output
