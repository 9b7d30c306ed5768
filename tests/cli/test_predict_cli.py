"""`nnperf predict` and `nnperf compare` through the CLI: output, JSON and bad input."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_predict_prints_modules_and_step():
    r = run("predict", "mlp", "--batch", "8", "--gpu", "h100")
    assert r.exit_code == 0, r.output
    assert "step time" in r.output
    assert "(optimizer)" in r.output and "Linear" not in r.output  # module names, not types


def test_predict_json_has_timing_fields():
    r = run("predict", "mnist-cnn", "--batch", "64", "--gpu", "a100", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["totals"]["bound"] == "host"
    assert doc["gpu"]["sm_count"] == 108


def test_unknown_gpu_lists_close_names():
    r = run("predict", "mlp", "--gpu", "h10")
    assert r.exit_code == 2
    assert "h100" in r.output.lower() and "Traceback" not in r.output


def test_bf16_on_v100_is_a_clear_error():
    r = run("predict", "mlp", "--gpu", "v100", "--dtype", "bf16")
    assert r.exit_code == 2
    assert "bf16" in r.output and "Traceback" not in r.output


def test_compare_puts_gpus_side_by_side(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text("h100 = 10.0\n")
    r = run("compare", "mlp", "--batch", "256", "--gpus", "a100,h100", "--prices", str(prices), "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["gpus"]
    assert [row["id"] for row in rows] == ["a100-80gb-sxm", "h100-sxm"]
    h100 = rows[1]
    assert h100["usd_per_hour"] == 10.0
    per_million = 10.0 / 3600 * 1e6 / (256 / h100["step_time_s"])
    assert abs(h100["usd_per_million_samples"] - per_million) < 1e-9 * per_million


def test_compare_rejects_bad_gpu_before_tracing():
    r = run("compare", "mlp", "--gpus", "a100,nosuchgpu")
    assert r.exit_code == 2 and "nosuchgpu" in r.output


def _gib(n: float) -> int:
    return int(n * 2**30)


def test_predict_says_when_the_step_does_not_fit():
    """0.25 GiB cannot even hold a CUDA context: the summary and the JSON say so."""
    r = run("predict", "mlp", "--batch", "8", "--gpu", "h100", "--set", "memory_gib=0.25")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "device memory at peak (predicted)" in ln)
    assert "of 252 MiB: DOES NOT FIT" in line  # 256 MiB less the driver's 1.5%
    doc = json.loads(run("predict", "mlp", "--batch", "8", "--gpu", "h100", "--set", "memory_gib=0.25",
                         "--json").output)
    tot = doc["totals"]
    assert tot["gpu_memory_bytes"] == int(_gib(0.25) * 0.985)
    assert tot["device_total_bytes"] > _gib(0.25) and tot["fits_in_memory"] is False
    fits = json.loads(run("predict", "mlp", "--batch", "8", "--gpu", "h100", "--json").output)["totals"]
    # what CUDA reports on an 80 GB H100 (catalog reading), not the nominal 80 GiB
    assert fits["fits_in_memory"] is True and fits["gpu_memory_bytes"] == 81090 * 2**20


def test_compare_marks_gpus_the_step_does_not_fit_and_gives_them_no_cost():
    """A million-sample MLP batch: the memory model's device total (the same as
    'nnperf memory' prints) is above a T4's 16 GiB and below an H100's 80 GiB (each less what
    the driver keeps: 1.5% on the T4, which has no reading; the H100 reports 81090 MiB)."""
    args = ["compare", "mlp", "--batch", "1000000", "--gpus", "t4,h100"]
    rows = json.loads(run(*args, "--json").output)["gpus"]
    t4, h100 = rows
    out = run("memory", "mlp", "--batch", "1000000", "--gpu", "t4", "--json").output
    memory, _ = json.JSONDecoder().raw_decode(out)  # the document, before the does-not-fit line
    assert t4["device_total_bytes"] == memory["memory"]["device_total"]
    assert t4["gpu_memory_bytes"] == int(_gib(16) * 0.985) < t4["device_total_bytes"] < _gib(79)
    assert t4["fits_in_memory"] is False and t4["usd_per_million_samples"] is None
    assert h100["fits_in_memory"] is True and h100["usd_per_million_samples"] > 0
    table = run(*args).output
    t4_line = next(ln for ln in table.splitlines() if "T4" in ln)
    assert "of 15.8 GiB" in t4_line and "DOES NOT FIT" in t4_line and "n/a: does not fit" in t4_line
    h100_line = next(ln for ln in table.splitlines() if "H100" in ln)
    assert "of 79.2 GiB" in h100_line and "fits" in h100_line and "does not fit" not in h100_line


def test_root_own_ops_row_and_depth_one_rows_add_up():
    """mnist's Net calls F.relu, max_pool2d and log_softmax itself: a row of their own."""
    doc = json.loads(run("predict", "mnist-cnn", "--batch", "2", "--depth", "1", "--json").output)
    rows = {m["name"]: m for m in doc["modules"]}
    own = rows["(own ops)"]
    assert own["type"] == "Net" and own["depth"] == 1 and own["time_s"] > 0
    depth1 = [m["time_s"] for m in doc["modules"] if m["depth"] == 1]
    assert sum(depth1) == pytest.approx(rows[""]["time_s"])
    table = run("predict", "mnist-cnn", "--batch", "2", "--depth", "1").output
    assert "(Net) own ops" in table and "\n(Net) " in "\n" + table.replace("(Net) own", "")


def test_bound_label_agrees_with_the_modeled_columns():
    """resnet's conv1 is labeled compute-bound: its modeled compute time (printed) is above
    its modeled memory time, not below it as the ideal peak-based terms were."""
    doc = json.loads(run("predict", "resnet18", "--batch", "64", "--gpu", "h100", "--amp", "bf16",
                         "--depth", "1", "--json").output)
    for m in doc["modules"] + doc["ops"]:
        name = m.get("name", m.get("op"))
        if name == "":  # the root row carries the step's bound (the largest share of kernel time)
            continue
        if m["bound"] == "compute":
            assert m["compute_model_s"] >= m["memory_model_s"], name
        elif m["bound"] == "memory":
            assert m["memory_model_s"] >= m["compute_model_s"], name
    root = next(m for m in doc["modules"] if m["name"] == "")
    assert root["bound"] == doc["totals"]["bound"]


def test_predict_respects_columns_when_piped():
    """COLUMNS=100: every line fits in 100 characters and a module's row is one line."""
    r = CliRunner().invoke(cli, ["predict", "mnist-cnn", "--batch", "2"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(ln) for ln in lines) <= 100
    fc1 = [ln for ln in lines if ln.lstrip().startswith("fc1 ")]
    assert len(fc1) == 1 and "host" in fc1[0] and "µs" in fc1[0]
    assert "…" not in r.output  # nothing squeezed into an ellipsis


def test_tiny_rows_print_no_bandwidth_to_stay_compute_bound():
    """The scalar loss is launch- or host-bound: no 'needed bandwidth' of hundreds of TB/s."""
    out = run("predict", "resnet18", "--batch", "64", "--gpu", "h100", "--amp", "bf16", "--depth", "1").output
    loss = next(ln for ln in out.splitlines() if ln.startswith("(loss)"))
    assert re.search(r"%\s+(launch|host)\s", loss) and loss.rstrip().endswith(" -")
    conv1 = next(ln for ln in out.splitlines() if ln.startswith("conv1 "))
    assert conv1.rstrip().endswith("G") or "T/" in conv1  # a compute-bound layer keeps its figure


def test_throughput_has_one_format():
    tokens = run("predict", "gpt2", "--batch", "2", "--seq", "64", "-O", "n_layer=1", "--gpu", "h100").output
    samples = run("predict", "mlp", "--batch", "64", "--gpu", "h100").output
    tok = next(ln for ln in tokens.splitlines() if "throughput" in ln)
    smp = next(ln for ln in samples.splitlines() if "throughput" in ln)
    assert re.search(r"\d+(\.\d+)? k tokens/s", tok) and "e+" not in tok
    assert re.search(r"\d+(\.\d+)? (k )?samples/s", smp) and "," not in smp


def test_mfu_label_names_the_flops_it_counts():
    out = run("predict", "mlp", "--batch", "64", "--gpu", "h100").output
    assert "MFU (forward+backward FLOPs / fp32 peak 67 TFLOP/s)" in out
    assert "model FLOPs" not in out


def test_mfu_label_of_an_inference_pass_counts_forward_flops_and_names_a_gemvs_unit():
    """Batch-1 decoding: every projection is a matrix-vector product, which cuBLAS runs on CUDA
    cores; the A100's bf16 CUDA-core peak is 39 TFLOP/s (datasheet), its tensor peak 312."""
    out = run("predict", "mlp", "--batch", "1", "--inference", "--dtype", "bf16", "--gpu", "a100-80gb-sxm").output
    assert "MFU (forward FLOPs / bf16-cuda-core peak 39 TFLOP/s)" in " ".join(out.split())


def test_training_options_beside_inference_are_refused():
    """An inference step runs no optimizer: an --optimizer the user typed would be dropped."""
    result = CliRunner().invoke(cli, ["predict", "mlp", "--inference", "--optimizer", "sgd", "--optimizer-impl", "fused"])
    assert result.exit_code == 2
    assert "--optimizer, --optimizer-impl are for a training step" in result.output
    assert CliRunner().invoke(cli, ["predict", "mlp", "--inference"]).exit_code == 0


def test_compare_keeps_the_gpus_a_step_can_run_on():
    """bf16 autocast cannot run on a V100 (no bf16 units): its row says so, the H100 is compared;
    a step no listed GPU can run is the error itself."""
    result = CliRunner().invoke(cli, ["compare", "mlp", "--gpus", "v100,h100", "--amp", "bf16", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in json.loads(result.output)["gpus"]}
    assert "no bf16 units" in rows["v100-sxm2"]["error"] and "step_time_s" not in rows["v100-sxm2"]
    assert rows["h100-sxm"]["step_time_s"] > 0
    alone = CliRunner().invoke(cli, ["compare", "mlp", "--gpus", "v100,t4", "--amp", "bf16"])
    assert alone.exit_code == 2 and "no bf16 units" in alone.output


def test_a_compiled_loss_needs_a_training_step_and_a_cross_entropy():
    """--loss compiled would be dropped silently by an inference pass, and changes nothing for a
    loss without cross entropy (mnist's NLL over its own log-softmax): both refused in one line."""
    result = CliRunner().invoke(cli, ["predict", "mlp", "--inference", "--loss", "compiled"])
    assert result.exit_code == 2
    assert "--loss is for a training step" in result.output
    result = CliRunner().invoke(cli, ["analyze", "mnist-cnn", "--loss", "compiled"])
    assert result.exit_code == 2
    assert "--loss compiled changes nothing here" in result.output
    assert "Traceback" not in result.output
