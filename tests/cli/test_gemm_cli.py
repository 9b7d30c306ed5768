"""``nnperf gemm``: the guide-style explanation, sweeps, what-if options and bad input."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_explains_one_gemm():
    result = run("gemm", "4096", "4096", "4096", "--gpu", "h100", "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    # 256x128 tiles: (4096/256) * (4096/128) = 512 CTAs; ceil(512/132) = 4 waves;
    # wave efficiency 512 / (4 * 132) = 97.0%.
    out = result.output
    assert "256x128" in out and "512 CTAs on 132 SMs -> 4 waves" in out and "97.0%" in out
    assert "FLOP = 2 x MAC" in out and "compute-bound" in out


def test_json_values():
    result = run("gemm", "4096", "4096", "4095", "-g", "h100", "--json")
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    assert e["flops"] == 2 * 4096 * 4096 * 4095
    assert e["ctas"] == 512 and e["waves"] == math.ceil(512 / 132)
    assert e["aligned"] is False and "K=4095" in e["alignment_note"]


def test_sweep_shows_the_wave_boundary():
    result = run(
        "gemm", "1", "1", "1", "--sweep", "mnk:2048:2304:128", "--json", "--set", "sm_count=132"
    )
    rows = json.loads(result.output)
    assert [r["m"] for r in rows] == [2048, 2176, 2304]
    # 2048 -> 128 CTAs of 256x128: one wave; 2176 crosses into a second wave: throughput drops.
    assert rows[1]["achieved_flops"] < rows[0]["achieved_flops"]
    table = run("gemm", "1", "1", "1", "--sweep", "mnk:2048:2304:128")
    assert table.exit_code == 0 and "2176" in table.output


def test_set_and_gpu_file(tmp_path):
    result = run(
        "gemm", "8192", "8192", "8192", "--dtype", "fp32", "--set", "peak_tflops.fp32=120", "--json"
    )
    assert json.loads(result.output)["peak_flops"] == 120e12
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "Mine"\nvendor = "NVIDIA"\narchitecture = "Hopper"\ncompute_capability = "9.0"\n'
        'sm_count = 100\nboost_clock_mhz = 1500\nmemory_gib = 40\nmemory_type = "HBM3"\n'
        "memory_bandwidth_gbs = 2000\n[peak_tflops.tensor]\nbf16 = 500\n[peak_tflops.cuda]\n"
        "fp32 = 40\n"
    )
    e = json.loads(run("gemm", "4096", "4096", "4096", "--gpu-file", str(path), "--json").output)
    assert e["gpu"] == "mine" and e["peak_flops"] == 500e12


def test_measured_profile_file(tmp_path):
    from nnperf.hardware import default_profile, load_gpu, save_profile

    path = tmp_path / "profile.toml"
    save_profile(default_profile(load_gpu("h100")).replace(gemm_peak_fraction=0.5), path)
    result = run("gemm", "4096", "4096", "4096", "--profile", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["math_fraction"] == 0.5


@pytest.mark.parametrize(
    "args,message",
    [
        (["0", "64", "64"], "invalid M 0: expected an integer from 1 to 2,147,483,647"),
        (["64", "64", "2147483648"], "invalid K 2147483648"),
        (["64", "64", "64", "--batch", "0"], "invalid --batch 0"),
        (["64", "64", "64", "--dtype", "fp4"], "unknown dtype 'fp4'"),
        (["64", "64", "64", "--gpu", "nope"], "unknown GPU 'nope'"),
        (
            ["64", "64", "64", "--gpu", "v100", "--dtype", "bf16"],
            "V100-SXM2 has no bf16 units; valid dtypes: fp64, fp32, fp16",
        ),
        (["64", "64", "64", "--sweep", "q:1:8:1"], "--sweep"),
        (["64", "64", "64", "--sweep", "k:8:1:1"], "--sweep"),
        (["64", "64", "64", "--set", "sm_count=0"], "sm_count"),
        (["64", "64", "64", "--set", "warp_size=32"], "unknown key 'warp_size'"),
    ],
)
def test_bad_input_is_a_usage_error(args, message):
    result = run("gemm", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_integer_gemms_count_operations_not_flops():
    """A100 int8 dense tensor peak: 624 TOPS (datasheet); a 1x1x1 GEMM is 2 operations."""
    out = run("gemm", "1", "1", "1", "--dtype", "int8", "--gpu", "a100").output
    assert "int8 peak 624 TOPS" in out
    assert "2 ops (op = 2 x MAC: 1 MAC)" in out
    assert "FLOP" not in out
    sweep = run("gemm", "1", "1", "1", "--dtype", "int8", "--gpu", "a100", "--sweep", "mnk:1024:1152:128").output
    assert "TOPS" in sweep and "TFLOP/s" not in sweep


def test_sizes_are_binary():
    """4096^3 bf16: A, B and C are 4096*4096*2 bytes each, 3 * 32 MiB = 96 MiB."""
    out = run("gemm", "4096", "4096", "4096", "--dtype", "bf16", "--gpu", "h100").output
    assert "96 MiB (each operand read once" in out
