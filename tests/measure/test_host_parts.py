"""The host-parts microbenchmarks run end to end (a quick CPU run: every code path, no timing
asserted), their file reads back, and a calibration turns them into profile fields."""

from __future__ import annotations

import math

import pytest
import torch

from nnperf.hardware import load_gpu
from nnperf.measure.calibration import Calibration, host_parts
from nnperf.measure.calibration.profile import HOST_PART_FIELDS, build_profile


def test_a_quick_run_measures_every_part(tmp_path):
    seen = []
    result = host_parts.run(torch.device("cpu"), host_parts.Plan.quick(), seen.append)
    assert result.complete and seen == [name for name, _ in host_parts.PARTS]
    expected = {*HOST_PART_FIELDS, "op_s", "view_s", "in_context", "backward_op_s", "conv_op_s"}
    assert expected <= set(result.parts) and all(math.isfinite(v) for v in result.parts.values())
    assert set(result.optimizers) | set(result.skipped) == {f"{o}/{i}" for o, i in host_parts.OPTIMIZERS}
    out = tmp_path / "parts.json"
    host_parts.write(result, out)
    assert host_parts.load(out).parts == result.parts
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_a_file_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"schema": "something/1"}')
    with pytest.raises(ValueError, match="not a host-parts file"):
        host_parts.load(path)


def test_a_calibration_sets_the_host_fields_from_its_parts():
    cal = Calibration(device="cuda:0", device_name="x", quick=True, date="d", torch_version="t", threads=1)
    cal.host_parts = {"parts": {"module_call_s": 2e-6, "backward_node_s": -1e-7, "in_context": 0.9,
                                "sync_s": 12e-6, "conv_op_s": 30e-6},
                      "optimizers": {"adamw/foreach": {"step_s": 80e-6, "param_s": 3e-6}}}
    profile = build_profile(cal, load_gpu("h100"))
    assert profile.host_module_call_s == 2e-6 and profile.host_sync_s == 12e-6
    assert profile.host_dispatch_by_kind_s["conv"] == 30e-6  # cuDNN's call, measured on this host
    assert profile.host_backward_node_s == 0.0  # noise made it negative: it adds nothing
    assert profile.host_in_context == 1.0  # a stream of ops is never cheaper than a loop of one
    assert profile.host_optimizer_step_s == {"adamw/foreach": 80e-6}
    assert profile.host_optimizer_param_s == {"adamw/foreach": 3e-6}
    default = build_profile(Calibration(device="cuda:0", device_name="x", quick=True, date="d",
                                        torch_version="t", threads=1), load_gpu("h100"))
    assert default.host_python_call_s == profile.host_python_call_s  # not measured: the default's
