"""--host changes the predicted host time, so every output says which host it assumed: the
JSON always, every text header (the default, a rented GPU's cloud VM, too), and --help gives
the default (found by a new-user trial)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

MLP = ["mlp", "-O", "widths=8,16,4", "--batch", "4"]


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250", "NNPERF_FIT_WORKERS": "1"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(("given", "host", "ghz"), [
    ((), "cloud-vm", 2.44),  # default_profile.toml: the cloud VM of nnperf's H200 run
    (("--host", "epyc-7742"), "epyc-7742", 3.4),  # AMD: EPYC 7742 max boost 3.4 GHz
    (("--host", "DGX A100"), "epyc-7742", 3.4),  # the DGX A100's CPU, named by its system
])
def test_predict_json_records_the_host(given, host, ghz):
    options = json.loads(run("predict", *MLP, "--gpu", "h100", *given, "--json"))["timing_options"]
    assert (options["host"], options["host_turbo_ghz"]) == (host, ghz)


def test_compare_and_advise_json_record_the_host():
    doc = json.loads(run("compare", *MLP, "--gpus", "h100,a100", "--host", "xeon-8480c", "--json"))
    assert (doc["host"], doc["host_turbo_ghz"]) == ("xeon-8480c", 3.8)  # Intel ARK: 3.80 GHz turbo
    doc = json.loads(run("advise", *MLP, "--gpu", "h100", "--host", "xeon-8480c", "--json"))
    assert (doc["host"], doc["host_turbo_ghz"]) == ("xeon-8480c", 3.8)


def test_headers_name_the_host():
    assert run("predict", *MLP, "--gpu", "h100", "--host", "epyc-7742").startswith(
        "mlp (widths=8,16,4) on H100 SXM5 80GB, host epyc-7742 (training")
    assert run("compare", *MLP, "--gpus", "h100", "--host", "epyc-7742").splitlines()[0].rstrip().endswith(
        "across GPUs, host epyc-7742")
    assert run("advise", *MLP, "--gpu", "h100", "--host", "epyc-7742").startswith(
        "Code changes for mlp (widths=8,16,4) on h100-sxm, host epyc-7742: step")
    assert run("predict", *MLP, "--gpu", "h100").startswith("mlp (widths=8,16,4) on H100 SXM5 80GB, host cloud-vm (")


def test_help_gives_the_default_host():
    text = " ".join(run("predict", "--help").split())
    assert "Default: cloud-vm, the virtual machine a rented GPU comes with" in text
