"""validation/rebuild_profile.py: a committed calibration's profile derived again, with the host
parts a later session measured on the same machine, and refused from another machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nnperf.hardware import load_gpu
from nnperf.hardware.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "validation" / "data" / "h200-sxm"
HOST_PARTS = H200 / "host-parts-20261204T175020.json"


def rebuild(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "validation" / "rebuild_profile.py"), *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_host_parts_set_the_profiles_host_costs(tmp_path):
    out = tmp_path / "profile.toml"
    done = rebuild(str(H200 / "profile.json"), "--host-parts", str(HOST_PARTS), "-o", str(out))
    assert done.returncode == 0, done.stderr
    profile = load_profile(out, load_gpu("h200-sxm"))
    measured = json.loads(HOST_PARTS.read_text())
    parts = measured["parts"]
    assert profile.host_backward_node_s == pytest.approx(parts["backward_node_s"])
    assert profile.host_module_call_s == pytest.approx(parts["module_call_s"])
    assert profile.host_sync_s == pytest.approx(parts["sync_s"])  # .item() timed directly
    assert profile.host_in_context == pytest.approx(parts["in_context"])
    assert profile.host_dispatch_by_kind_s["conv"] == pytest.approx(parts["conv_op_s"])
    adamw = measured["optimizers"]["adamw/foreach"]
    assert profile.host_optimizer_step_s["adamw/foreach"] == pytest.approx(adamw["step_s"])
    assert profile.host_optimizer_param_s["adamw/foreach"] == pytest.approx(adamw["param_s"])
    assert profile.unmeasured_host_parts == ()


def test_host_parts_of_another_machine_are_refused_in_one_line(tmp_path):
    other = json.loads(HOST_PARTS.read_text())
    other["device_name"] = "NVIDIA H100 80GB HBM3"
    foreign = tmp_path / "host-parts.json"
    foreign.write_text(json.dumps(other))
    done = rebuild(str(H200 / "profile.json"), "--host-parts", str(foreign), "-o", str(tmp_path / "p.toml"))
    assert done.returncode == 2
    assert "was measured on NVIDIA H100 80GB HBM3" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "p.toml").exists()
