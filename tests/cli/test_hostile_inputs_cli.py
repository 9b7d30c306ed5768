"""Malformed invocations a hostile user tries: each is one line naming the bad input and
what is valid, with exit 2 (3 for a model that cannot be loaded), never a traceback, and
never a silently wrong answer (nan ns, 366% of peak, a memory time of 0 s)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

BIG = "99999999999999999999999"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bin.dat").write_bytes(bytes(range(128, 256)) * 20)
    (tmp_path / "sx.py").write_text("def f():\n    raise SystemExit(7)\n")
    (tmp_path / "sximport.py").write_text("import sys\nsys.exit(4)\n")
    (tmp_path / "lin.py").write_text("from torch import nn\ndef f():\n    return nn.Linear(8, 4)\n")
    for name, line in {"nan": "bandwidth_fraction = nan", "inf": "kernel_overhead_s = inf",
                       "big": "host_dispatch_s = 1e308", "five": "bandwidth_fraction = 5",
                       "split": "split_k_max = 2.5", "tile": '[tile_relative_efficiency]\n"0x128" = 1.0',
                       "align": '[alignment_penalty]\n"64B" = 0.5',
                       "curve": "bandwidth_curve = [[1, inf]]", "gemm": "[gemm_efficiency]\nbf16 = [[1e9, 3.0]]",
                       "gpu": "gpu = 5"}.items():
        (tmp_path / f"{name}.toml").write_text(line + "\n")
    cluster = ('name = "x"\ngpu = "h100-sxm"\ngpus_per_node = 8\n[intra]\nlink_gbs = 450\nefficiency = 0.8\n'
               'latency_us = 5\n[inter]\nlink_gbs = 50\nefficiency = 0.8\nlatency_us = 10\n')
    (tmp_path / "string-node.toml").write_text(cluster.replace("gpus_per_node = 8", 'gpus_per_node = "8"'))
    (tmp_path / "no-gpu.toml").write_text(cluster.replace('gpu = "h100-sxm"', 'gpu = "h900"'))
    (tmp_path / "chars.toml").write_text('sources = "abc"\n' + cluster)
    return tmp_path


CASES = [
    # (argv with {d} for the files folder, exit code, words the one line must hold)
    (["memory", "mlp", "--batch", BIG], 2, f"invalid --batch {BIG}: expected an integer from 1 to 2,147,483,647"),
    (["memory", "{d}/lin.py:f", "--input-shape", "99999999999,99999999999"], 2,
     "invalid --input-shape '99999999999,99999999999': every size must be an integer from 1 to 2,147,483,647"),
    (["memory", "{d}/lin.py:f", "--input-shape", "2147483647,2147483647,2147483647"], 2, "at most 2**48"),
    (["predict", "mlp", "--set", "memory_gib=1e400"], 2, "--set memory_gib='1e400': expected a positive capacity in GiB, a finite number in (0, 1,048,576]"),
    (["predict", "mlp", "--gpu-file", "{d}/bin.dat"], 2, "is not a text file"),
    (["predict", "mlp", "--profile", "{d}/bin.dat"], 2, "is not a text file"),
    (["report", "mlp", "--measured", "{d}/bin.dat", "-o", "{d}/r.html"], 2, "measurement file"),
    (["predict", "a" * 5000 + ".py:f"], 3, "cannot be read: File name too long"),
    (["predict", "a" * 5000], 3, "unknown model"),
    (["predict", "mlp", "--profile", "{d}/nan.toml"], 2, "field 'bandwidth_fraction' is 'nan'; expected a finite number in (0, 1]"),
    (["predict", "mlp", "--profile", "{d}/inf.toml"], 2, "field 'kernel_overhead_s' is 'inf'; expected a finite number in (0, 1]"),
    (["predict", "mlp", "--profile", "{d}/big.toml"], 2, "field 'host_dispatch_s' is '1e+308'; expected a finite number in (0, 1]"),
    (["predict", "mlp", "--profile", "{d}/five.toml"], 2, "field 'bandwidth_fraction' is '5'; expected a finite number in (0, 1]"),
    (["predict", "mlp", "--profile", "{d}/split.toml"], 2, "field 'split_k_max' is '2.5'; expected an integer from 1 to 1,024"),
    (["predict", "mlp", "--profile", "{d}/tile.toml"], 2, "bad tile name '0x128'"),
    (["predict", "mlp", "--profile", "{d}/align.toml"], 2, "unknown alignment class '64B'; valid: 16B, 128B"),
    (["predict", "mlp", "--profile", "{d}/curve.toml"], 2, "bandwidth_curve': y is 'inf'"),
    (["predict", "mlp", "--profile", "{d}/gemm.toml"], 2, "gemm_efficiency'.bf16: y is '3.0'; expected a finite number in (0, 1]"),
    (["predict", "mlp", "--profile", "{d}/gpu.toml"], 2, "field 'gpu' is '5'; expected a string"),
    (["predict", "mlp", "--profile", "{d}"], 2, "is a directory"),
    (["predict", "mlp", "--set", "peak_tflops.fp32=inf"], 2, "--set peak_tflops.fp32='inf'"),
    (["predict", "mlp", "--set", "memory_bandwidth_gbs=inf"], 2, "--set memory_bandwidth_gbs='inf'"),
    (["predict", "mlp", "--set", "memory_bandwidth_gbs=nan"], 2, "--set memory_bandwidth_gbs='nan'"),
    (["predict", "mlp", "--set", "sm_count=1.5"], 2, "an integer from 1 to 100,000"),
    (["predict", "mlp", "--set", "memory_gib=1", "--set", "memory_gib=2"], 2, "--set memory_gib is given twice"),
    (["predict", "mlp", "--gpu", ""], 2, "--gpu '' is empty"),
    (["gemm", "8", "8", "8", "--gpu", " "], 2, "--gpu ' ' is empty"),
    (["gpus", ""], 2, "NAME '' is empty"),
    (["fit", "mlp", "--batch", "0"], 2, "invalid --batch 0: expected an integer from 1 to 2,147,483,647"),
    (["fit", "mlp", "--max-batch", "0"], 2, "invalid --max-batch 0"),
    (["predict", "mlp", "--input-dtype", "fp16"], 2, "--input-dtype fp16 is not used"),
    (["predict", "{d}/lin.py:f", "--tokens", "2,8", "--input-dtype", "bf16"], 2, "(token ids are int64)"),
    (["predict", "mlp", "--vocab", "100"], 2, "--vocab 100 is not used"),
    (["predict", "{d}/lin.py:f", "--tokens", "2,8", "--input-shape", "2,8"], 2, "--tokens and --input-shape"),
    (["predict", "{d}/sx.py:f"], 3, "factory '{d}/sx.py:f' raised SystemExit(7)"),
    (["predict", "{d}/sximport.py:f"], 3, "failed: SystemExit(4)"),
    (["predict", "mlp", "--seq", "0"], 2, "invalid --seq 0"),
    (["predict", "mlp", "--batch", "abc"], 2, "invalid --batch 'abc'"),
    (["predict", "mlp", "--depth", "-1"], 2, "invalid --depth -1: expected an integer from 0 to 1,000"),
    (["memory", "mlp", "--context-mib", "inf"], 2, "invalid --context-mib 'inf'"),
    (["memory", "mlp", "--context-mib", "nan"], 2, "invalid --context-mib 'nan'"),
    (["memory", "mlp", "--grad-accum", "0"], 2, "invalid --grad-accum 0"),
    (["memory", "mlp", "--timeline-points", BIG], 2, "invalid --timeline-points"),
    (["gemm", BIG, "8", "8"], 2, f"invalid M {BIG}"),
    (["measure", "mlp", "--device", "cpu", "--warmup", "-1"], 2, "invalid --warmup -1"),
    (["compare", "mlp"], 2, "compare needs the GPUs to compare"),
    (["compare", "mlp", "--gpus", "h100,,a100"], 2, "empty name between commas"),
    (["compare", "mlp", "--gpus", "h100", "--prices", "{d}/bin.dat"], 2, "price file"),
    (["report", "mlp", "-o", "{d}/same.html", "--svg", "{d}/same.html"], 2, "both name"),
    (["bench", "transfer", "--sizes", "64,,128"], 2, "invalid --sizes '64,,128'"),
    (["bench", "transfer", "--sizes", "1000000"], 2, "every n must be an integer from 1 to 65,536"),
    # parsed into typed records before any work: each of these ran for minutes, crashed or was
    # read as something else before (issue 38)
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--cluster", "{d}/string-node.toml"], 2,
     "field 'gpus_per_node' is the string '8'; expected a whole number from 1 to 1,024"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--cluster", "{d}/no-gpu.toml"], 2,
     "field 'gpu' is 'h900', which is no GPU of the catalog"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--cluster", "{d}/chars.toml"], 2,
     "field 'sources' is the string 'abc'; expected a list"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--cluster", ""], 2, "--cluster '' is empty"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--tp", "1,1,1,1"], 2, "1 is named 4 times"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--data", "fsdp,fsdp"], 2, "fsdp is named 2 times"),
    (["plan", "gpt2", "--gpu", "h100", "--gpus", "8", "--schedule", "1f1b", "--schedule", "1f1b"], 2,
     "1f1b is named 2 times"),
    (["measure", "gpt2", "--layout", ""], 2, "--layout '' is empty"),
    (["predict", "mlp", "--gpu", "h100😀"], 2, "invalid GPU name 'h100😀': '😀' is in no GPU's name"),
    (["predict", "gpt2", "-O", "n_layer=1e30"], 2, "n_layer must be an integer from -2,147,483,647 to 2,147,483,647"),
    (["predict", "gpt2", "-O", "n_layer=nan"], 2, "invalid --model-opt 'n_layer=nan': nan is not a finite number"),
    (["predict", "gpt2", "-O", "n_layer=-inf"], 2, "-inf is not a finite number"),
    (["advise", "mlp", "--apply", "amp-bf16,amp-bf16"], 2, "--apply names 'amp-bf16' twice"),
    (["advise", "mlp", "--apply", "batch-8,batch-16"], 2, "--apply names two batch sizes"),
    (["advise", "mlp", "--apply", "batch-0"], 2, "--apply batch-0: batch 0: expected an integer from 1"),
]


@pytest.mark.parametrize(("argv", "code", "words"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_malformed_invocation_is_one_line(files, argv, code, words):
    res = CliRunner().invoke(cli, [a.replace("{d}", str(files)) for a in argv])
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    # a long temporary path (pytest-xdist's) is cut in the middle of the quoted name
    # (``errors.shown``), so the words around it are checked, and the path's start
    assert all(part in lines[0] for part in words.split("{d}")), lines[0]
    if "{d}" in words:
        assert str(files)[:20] in lines[0]
