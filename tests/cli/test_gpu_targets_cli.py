"""One resolver of GPU targets for every command: --gpu/--gpus/--gpu-file/--set/--profile
reach every GPU a command predicts on, and an option a command cannot use is not offered."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli
from nnperf.cli.gpu_options import resolve_targets
from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu, save_profile
from nnperf.hardware.profile import DEFAULTS_FILE

HUGE = textwrap.dedent("""\
    id = "huge"
    name = "Huge GPU"
    vendor = "NVIDIA"
    architecture = "Hopper"
    sm_count = 200
    boost_clock_mhz = 2000
    memory_gib = 200
    memory_type = "HBM3"
    memory_bandwidth_gbs = 8000
    [peak_tflops.tensor]
    bf16 = 2000
    [peak_tflops.cuda]
    fp32 = 100
""")


@pytest.fixture
def gpu_file(tmp_path):
    path = tmp_path / "gf.toml"
    path.write_text(HUGE)
    return path


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_what_ifs_and_profile_reach_every_target(gpu_file, tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("bandwidth_fraction = 0.5\n")
    targets = resolve_targets(["huge", "a100"], gpu_file, ["memory_bandwidth_gbs=1"], profile)
    assert [t.gpu.id for t in targets] == ["huge", "a100-80gb-sxm"]
    assert [t.gpu.memory_bandwidth_gbs for t in targets] == [1.0, 1.0]
    assert [t.profile.bandwidth_fraction for t in targets] == [0.5, 0.5]
    assert targets[0].gpu.sm_count == 200  # the file's own values, not a catalog GPU's


def test_without_profile_the_targets_carry_none():
    (target,) = resolve_targets(["h100"], with_profile=False)
    assert target.profile is None


@pytest.mark.parametrize(("names", "with_file", "message"), [
    ([""], False, "GPU name '' is empty"),
    (["h100", "h100-sxm"], False, "GPU 'h100-sxm' is named twice (h100 and h100-sxm)"),
    (["h100"], True, "describes 'huge' (Huge GPU), which --gpu does not name"),
    (["huge", "a100", "huge"], True, "GPU 'huge' is named twice"),
])
def test_refused_targets(gpu_file, names, with_file, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve_targets(names, gpu_file if with_file else None)


def _step_bytes() -> int:
    res = run("analyze", "mlp", "--json")
    return json.loads(res.output)["totals"]["bytes"]


def test_compare_applies_set_and_gpu_file_to_every_gpu(gpu_file):
    res = run("compare", "mlp", "--gpus", "huge,h100", "--gpu-file", str(gpu_file),
              "--set", "memory_bandwidth_gbs=1", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["gpus"]
    assert [r["id"] for r in rows] == ["huge", "h100-sxm"]
    # at 1 GB/s every byte of the step takes at least 1 ns: a lower bound from the analysis
    floor = _step_bytes() / 1e9
    assert all(r["step_time_s"] >= floor for r in rows)


def test_report_gpus_accepts_the_gpu_file_gpu_and_the_what_ifs(gpu_file, tmp_path):
    out = tmp_path / "r.html"
    res = run("report", "mlp", "--gpus", "huge,h100", "--gpu-file", str(gpu_file),
              "--set", "memory_bandwidth_gbs=1", "--no-memory", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "Huge GPU" in out.read_text()


def test_report_refuses_gpu_with_gpus():
    res = run("report", "mlp", "--gpu", "h100", "--gpus", "a100", "-o", "x.html")
    assert res.exit_code == 2
    assert "--gpu and --gpus" in res.output


@pytest.mark.parametrize("command", ["memory", "fit"])
def test_memory_and_fit_offer_no_profile(command):
    res = run(command, "mlp", "--profile", str(DEFAULTS_FILE))
    assert res.exit_code == 2
    assert "No such option '--profile'" in res.output


def test_measure_on_cpu_refuses_what_ifs_it_cannot_apply():
    res = run("measure", "mlp", "--device", "cpu", "--set", "memory_gib=1")
    assert res.exit_code == 2
    assert "--set/--profile" in res.output


def test_shipped_default_profile_is_a_valid_profile():
    res = run("predict", "mlp", "--gpu", "h100", "--profile", str(DEFAULTS_FILE), "--json")
    plain = run("predict", "mlp", "--gpu", "h100", "--json")
    assert res.exit_code == 0, res.output
    # the shipped defaults read as a profile are the defaults: the same prediction
    assert json.loads(res.output)["totals"]["step_time_s"] == json.loads(plain.output)["totals"]["step_time_s"]


def test_a_profile_value_in_the_defaults_layout_is_used(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[default]\nkernel_overhead_s = 0.5\n[architecture.hopper]\ngemm_peak_fraction = 0.5\n")
    (target,) = resolve_targets(["h100"], profile_file=path)
    assert target.profile.kernel_overhead_s == 0.5
    assert target.profile.gemm_peak_fraction == 0.5
    (other,) = resolve_targets(["a100"], profile_file=path)
    shipped = default_profile(load_gpu("a100"))
    assert other.profile.gemm_peak_fraction == shipped.gemm_peak_fraction  # not Hopper's 0.5


def test_a_profile_measured_on_another_gpu_is_used_with_a_note(tmp_path):
    path = tmp_path / "a100.toml"
    save_profile(default_profile(load_gpu("a100")).replace(gpu="a100-40gb-sxm", bandwidth_fraction=0.5), path)
    other = CliRunner().invoke(cli, ["predict", "mlp", "--gpu", "h100", "--profile", str(path), "--json"])
    assert other.exit_code == 0, other.output
    assert "measured on a100-40gb-sxm" in other.stderr and "h100-sxm" in other.stderr
    json.loads(other.stdout)  # the note stays out of the JSON
    same = CliRunner().invoke(cli, ["predict", "mlp", "--gpu", "a100-40gb-sxm", "--profile", str(path)])
    assert same.exit_code == 0 and "measured on" not in same.stderr
