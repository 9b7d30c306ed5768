"""A user's own operator: uncovered without a formula, counted and timed with one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nnperf
from nnperf.analysis import analyze
from nnperf.passes.costs.registry import CUSTOM_FORMULAS

BATCH, ROWS, COLS = 4, 8, 16


@torch.library.custom_op("nnperf_custom_tests::cubic", mutates_args=())
def cubic(x: torch.Tensor) -> torch.Tensor:
    """x * x * x + x: two multiplies and one add per element."""
    return x * x * x + x


@cubic.register_fake
def _cubic_fake(x):
    return torch.empty_like(x)


class UsesCubic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(COLS, COLS, bias=False)

    def forward(self, x):
        return self.fc(torch.ops.nnperf_custom_tests.cubic(x))


def cubic_cost(event):
    (x,) = event.inputs
    return nnperf.OpCost(
        nnperf.Category.ELEMENTWISE, flops=3 * x.numel, reads=event.inputs, writes=event.outputs
    )


@pytest.fixture(autouse=True)
def _restore_custom_formulas():
    saved = dict(CUSTOM_FORMULAS)
    yield
    CUSTOM_FORMULAS.clear()
    CUSTOM_FORMULAS.update(saved)


def _analyze():
    return analyze(UsesCubic(), inputs=(torch.randn(BATCH, ROWS, COLS),), train=False)


def _cubic_row(a):
    return next(o for o in a.ops if o.op == "nnperf_custom_tests.cubic")


@pytest.mark.parametrize(
    "op",
    [
        torch.ops.nnperf_custom_tests.cubic,
        torch.ops.nnperf_custom_tests.cubic.default,
        "nnperf_custom_tests.cubic",  # as reports print it
        "nnperf_custom_tests::cubic",
    ],
    ids=["packet", "overload", "dotted", "qualified"],
)
def test_a_registered_formula_counts_the_op(op):
    before = _analyze()
    assert [u["op"] for u in before.coverage["uncovered"]] == ["nnperf_custom_tests.cubic"]
    assert before.coverage["uncovered"][0]["count"] == 1

    nnperf.register_cost(op, cubic_cost)
    after = _analyze()
    row = _cubic_row(after)
    elements = BATCH * ROWS * COLS  # 512
    assert row.covered and row.category == "elementwise"
    assert row.flops == 3 * 512  # two multiplies and an add per element, by hand
    assert row.bytes == 2 * 512 * 4  # reads and writes the fp32 tensor once
    assert after.coverage["uncovered"] == [] and after.coverage["op_share"] == 1
    # the rest of the step is unchanged: only the custom op's FLOPs were added
    assert after.totals["flops"] - before.totals["flops"] == 3 * elements


def test_the_decorator_form_and_the_prediction_time_it():
    @nnperf.register_cost(torch.ops.nnperf_custom_tests.cubic.default)
    def _cost(event):
        return cubic_cost(event)

    a = _analyze()
    assert _cubic_row(a).flops == 3 * BATCH * ROWS * COLS
    p = nnperf.predict(a, "h100")
    (timed,) = [t for t in p.step.ops if t.op == "nnperf_custom_tests.cubic"]
    assert timed.category == "elementwise" and timed.kernels == 1 and timed.kernel_s > 0


def test_a_name_torch_does_not_know_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no operator 'nnperf_custom_tests\.cubci'"):
        nnperf.register_cost("nnperf_custom_tests.cubci", cubic_cost)
    with pytest.raises(TypeError, match="expected an operator"):
        nnperf.register_cost(cubic_cost, cubic_cost)


def test_the_custom_op_object_itself_names_its_default_overload():
    nnperf.register_cost(cubic, cubic_cost)  # what torch.library.custom_op returned
    assert _cubic_row(_analyze()).flops == 3 * BATCH * ROWS * COLS


@pytest.mark.parametrize(
    ("formula", "error", "message"),
    [
        (lambda e: 3.0 * e.inputs[0].numel, TypeError, "must return nnperf.OpCost"),
        (lambda e: nnperf.OpCost(nnperf.Category.GEMM, flops=1.0), ValueError, "gemm"),
        (lambda e: nnperf.OpCost("pointwise", flops=1.0), ValueError, "'pointwise'"),
    ],
    ids=["a-number", "gemm", "unknown-category"],
)
def test_a_wrong_result_names_the_op(formula, error, message):
    nnperf.register_cost(torch.ops.nnperf_custom_tests.cubic, formula)
    with pytest.raises(error, match=message) as info:
        _analyze()
    assert "nnperf_custom_tests.cubic" in str(info.value)


def test_a_category_given_as_its_string_is_accepted():
    nnperf.register_cost(
        torch.ops.nnperf_custom_tests.cubic,
        lambda e: nnperf.OpCost("reduction", flops=1.0, reads=e.inputs, writes=e.outputs),
    )
    assert _cubic_row(_analyze()).category is nnperf.Category.REDUCTION
