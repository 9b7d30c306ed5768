"""``nnperf calibrate --device cpu --quick``: files written, usable by predict; Ctrl-C."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli
from nnperf.measure import calibration


def test_quick_cpu_calibration_then_predict(tmp_path, monkeypatch):
    tiny = calibration.Plan(gemm_sizes=(32, 64), gemm_dtypes=("fp32",), skinny_m=8, conv_shapes=((2, 4, 8, 4, 3, 1),),
                            conv_dtype="fp32", bandwidth_bytes=(2**14,), tiny_ops=100, transfer_bytes=(), repeats=2)
    monkeypatch.setattr(calibration, "plan_for", lambda device, quick=False: tiny)
    out = tmp_path / "cpu-profile.toml"
    result = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--quick", "-o", str(out)])
    assert result.exit_code == 0, result.output
    device_file = tmp_path / "cpu-profile-device.toml"
    assert out.exists() and device_file.exists() and (tmp_path / "cpu-profile.json").exists()
    assert "--gpu-file" in result.output
    pred = CliRunner().invoke(cli, ["predict", "mlp", "-b", "4", "-O", "widths=16,10", "--gpu-file", str(device_file),
                                    "--profile", str(out), "--json"])
    assert pred.exit_code == 0, pred.output
    doc = json.loads(pred.output)
    assert doc["gpu"]["vendor"] == "CPU" and doc["totals"]["step_time_s"] > 0


def test_interrupt_writes_nothing_and_exits_nonzero(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration, "run_calibration", interrupted)
    out = tmp_path / "p.toml"
    result = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--quick", "-o", str(out)])
    assert result.exit_code == 130
    assert "interrupted" in result.output and list(tmp_path.iterdir()) == []


def test_unknown_device():
    result = CliRunner().invoke(cli, ["calibrate", "--device", "npu"])
    assert result.exit_code == 2 and "unknown device" in result.output


def test_a_kernel_bench_that_is_not_one_is_refused_before_measuring(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("measured before checking --kernel-bench")

    monkeypatch.setattr(calibration, "run_calibration", never)
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    result = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--quick", "--kernel-bench", str(bad),
                                      "-o", str(tmp_path / "p.toml")])
    assert result.exit_code == 2 and "is not a kernel-bench file" in result.output
