"""Output width, the root's labels, the fit decision and the terminal tables' wording."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.hardware import load_gpu
from nnperf.passes.memory.capacity import MemoryFit, fits
from nnperf.prediction import predict
from nnperf.report import console
from nnperf.report.labels import indented, module_label
from nnperf.report.measure_tables import print_measurement
from nnperf.report.prediction_tables import module_time_table


def test_columns_sets_the_width_when_piped(monkeypatch):
    monkeypatch.setattr(console.sys.stdout, "isatty", lambda: False, raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    assert console.make_console().width == 100
    monkeypatch.delenv("COLUMNS")
    assert console.make_console().width == console.WIDE  # wide only when nothing says otherwise
    monkeypatch.setenv("COLUMNS", "wide")
    assert console.make_console().width == console.WIDE


def test_root_labels():
    assert module_label("", "Net") == "(Net)"
    assert module_label("(own ops)", "Net") == "(Net) own ops"
    assert module_label("layer1.0", "Net") == "layer1.0"
    assert indented("layer1.0", 2, "Net") == "  layer1.0"


def test_fits_is_at_most_the_capacity():
    assert fits(80 * 2**30, 80 * 2**30) and not fits(80 * 2**30 + 1, 80 * 2**30)
    fit = MemoryFit(device_total=3 * 2**30, capacity=2 * 2**30)
    assert (fit.fits, fit.verdict, fit.share) == (False, "DOES NOT FIT", 1.5)
    assert fit.to_json() == {"device_total_bytes": 3 * 2**30, "gpu_memory_bytes": 2 * 2**30,
                             "fits_in_memory": False}


def test_a_total_just_over_the_capacity_does_not_read_as_equal():
    from types import SimpleNamespace

    from nnperf.report.prediction_tables import memory_line

    capacity = int(39.4 * 2**30)
    over = SimpleNamespace(memory_fit=MemoryFit(device_total=capacity + 2**20, capacity=capacity))
    assert memory_line(over) == "39.401 GiB of 39.4 GiB: DOES NOT FIT"
    far = SimpleNamespace(memory_fit=MemoryFit(device_total=145 * 2**30, capacity=40 * 2**30))
    assert memory_line(far) == "145 GiB of 40 GiB: DOES NOT FIT"


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _text(renderable, width: int = 200) -> str:
    from rich.console import Console

    c = Console(width=width, record=True)
    c.print(renderable)
    return c.export_text()


def test_module_table_headers_and_own_ops_row():
    p = predict(ReluNet(), load_gpu("h100"), inputs=torch.randn(16, 64))
    text = _text(module_time_table(p, 2))
    assert "(ReluNet) own ops" in text and "(ReluNet) " in text
    assert "Compute" in text and "modeled kernel times" in text  # the header says which basis


def test_measure_table_names_the_root_like_the_other_commands():
    doc = {
        "model": "mnist-cnn", "prediction_available": False, "gpu": None,
        "measurement": {"module_time_compared_with": "time_s", "device_name": "cpu", "device": "cpu",
                        "mode": "train", "batch": 2, "attribution": None},
        "modules": [{"name": "", "type": "Net", "depth": 0, "measured_time_s": 1e-3},
                    {"name": "(own ops)", "type": "Net", "depth": 1, "measured_time_s": 2e-4}],
        "totals": {"measured_step_time_spread": {"median": 1e-3, "p10": 1e-3, "p90": 1e-3, "iqr": 0.0, "n": 3},
                   "measured_peak_memory_bytes": None, "measured_memory_method": "none"},
    }
    from rich.console import Console

    c = Console(width=200, record=True)
    print_measurement(doc, console=c)
    text = c.export_text()
    assert "(Net)" in text and "(Net) own ops" in text and "(model)" not in text


def test_analyze_module_table_shows_the_optimizers_flops():
    """The (optimizer) row has no forward or backward FLOPs; its total column carries the
    optimizer's, the same figure as the phase totals."""
    from nnperf.analysis import analyze
    from nnperf.report.analysis_tables import module_table

    a = analyze(ReluNet(), inputs=torch.randn(16, 64))
    text = _text(module_table(a, 1), width=250)
    assert "FLOP total" in text
    row = next(ln for ln in text.splitlines() if ln.lstrip("│ ").startswith("(optimizer)"))
    from nnperf.units import si

    assert si(a.totals["flops_optimizer"]) in row and a.totals["flops_optimizer"] > 0
    assert "(ReluNet) own ops" in text


def test_an_fp32_cnns_roof_is_tf32_where_its_convolutions_run_tf32():
    """cuDNN runs fp32 convolutions in TF32 by default (TimingOptions.tf32_conv): the roof the
    points sit under is the TF32 peak, not the fp32 CUDA-core one."""
    import nnperf
    from nnperf.hardware import load_gpu
    from nnperf.report.roofline import roofs

    cnn = roofs(nnperf.predict("resnet18", "h100", batch=2, image_size=32))
    assert (cnn.peak_dtype, cnn.peak_flops) == ("tf32", load_gpu("h100").peak("tf32").flops)
    mlp = roofs(nnperf.predict("mlp", "h100", batch=2))  # matmuls: TF32 off by default
    assert (mlp.peak_dtype, mlp.peak_unit) == ("fp32", "cuda")


def test_an_advice_gain_is_in_readable_units():
    from types import SimpleNamespace

    from nnperf.report.advice_tables import _gain

    assert _gain(SimpleNamespace(gain_s=-1.27, gain_share=-4.22, note=None)) == "-1.27 s (5.2x slower)"
    assert _gain(SimpleNamespace(gain_s=-0.03, gain_share=-0.6, note=None)) == "-30 ms (-60.0%)"
    assert _gain(SimpleNamespace(gain_s=0.0123, gain_share=0.05, note=None)) == "+12.3 ms (+5.0%)"


def test_a_roofline_tooltip_gives_the_time_the_tables_give():
    """Its kernels' time places the point; the per-layer tables give its share of the step,
    which adds the device's wait on the host: the tooltip says both where they differ."""
    from nnperf.report.html.svg import point_title
    from nnperf.report.roofline import RooflinePoint

    point = RooflinePoint(key="l", label="l", type="Linear", ops=3, kernels=2, flops=2e9, bytes=1e6,
                          kernel_s=826e-6, time_s=871e-6, compute_s=1e-5, memory_s=1e-6, bound="compute")
    assert "826 µs of kernels" in point_title(point) and "871 µs of the step" in point_title(point)
    from dataclasses import replace

    assert "of the step" not in point_title(replace(point, time_s=point.kernel_s))
