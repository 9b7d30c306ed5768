"""The host CPU as a property of the prediction: ``--host`` rescales dispatch costs by the
single-core clock, per-category dispatch costs reach the timeline, bad names are one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.analysis import analyze
from nnperf.cli.app import cli
from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu, load_profile
from nnperf.hardware.cluster import load_cluster
from nnperf.hardware.host import DEFAULT_HOST, list_hosts, load_host, with_host
from nnperf.prediction import predict_analysis


def test_hosts_have_a_clock_and_a_source():
    hosts = list_hosts()
    assert {"epyc-7742", "xeon-e5-2698v4", "xeon-8480c"} <= set(hosts)
    assert all(h.turbo_ghz > 1 and h.source for h in hosts.values())


def test_a_host_is_found_by_id_or_by_the_system_it_is_in():
    assert load_host("DGX A100").id == "epyc-7742"  # NVIDIA DGX A100 datasheet: 2x EPYC 7742
    assert load_host("DGX-1").id == "xeon-e5-2698v4"
    with pytest.raises(UsageError, match="epyc-7742"):
        load_host("epyc-7724")


def test_the_default_host_is_the_cloud_vm():
    base = default_profile(load_gpu("a100"))
    assert base.host == "cloud-vm" and load_host("cloud-vm").turbo_ghz == base.host_turbo_ghz == 2.44
    assert base.host_label == "host cloud-vm"  # every table says which host it priced


def test_host_costs_scale_with_the_single_core_clock():
    base = default_profile(load_gpu("a100"))
    moved = with_host(base, load_host("epyc-7742"))  # 3.4 GHz max boost (AMD)
    ratio = 2.44 / 3.4  # the defaults describe the cloud VM, an effective 2.44 GHz core
    for field in ("host_dispatch_s", "host_view_s", "host_module_call_s", "host_backward_node_s",
                  "host_python_call_s", "host_autograd_record_s", "host_zero_grad_param_s"):
        assert getattr(moved, field) == pytest.approx(getattr(base, field) * ratio), field
    assert moved.host_dispatch_by_kind_s["conv"] == pytest.approx(base.host_dispatch_by_kind_s["conv"] * ratio)
    assert moved.host_in_context == base.host_in_context  # a ratio of two times on one host
    assert moved.host_sync_s == base.host_sync_s  # a device round trip, not the core's work
    again = with_host(moved, load_host("i9-11900k"))  # rescaled from 3.4 GHz, not from 2.44
    assert again.host_dispatch_s == pytest.approx(base.host_dispatch_s * 2.44 / 5.3)


def test_dispatch_cost_per_category_reaches_the_timeline(tmp_path):
    gpu = load_gpu("a100")
    analysis = analyze("mnist-cnn", batch=1)
    base = default_profile(gpu)
    path = tmp_path / "p.toml"
    path.write_text("host_dispatch_by_kind_s = { conv = 5e-5 }\n")
    conv_heavy = load_profile(path, gpu)
    before = predict_analysis(analysis, gpu, profile=base).step.host_s
    after = predict_analysis(analysis, gpu, profile=conv_heavy).step.host_s
    events = [e for e in analysis.trace.events if e.name.startswith("aten.convolution")]
    forward = sum(e.phase == "forward" for e in events)
    backward = sum(e.phase == "backward" for e in events)
    assert forward == 2 and backward == 2  # mnist-cnn: two convolutions
    was = base.host_dispatch_by_kind_s["conv"]  # the default's: a bf16 F.conv2d on the H200's VM
    assert was == pytest.approx(37.3e-6)
    # forward: called from Python; backward: dispatched by the engine from C++, without the
    # Python call's share; both in a stream of other ops (host_in_context)
    forward_calls = sum(e.python_call for e in events if e.phase == "forward")
    assert forward_calls == forward and not any(e.python_call for e in events if e.phase == "backward")
    extra = (forward + backward) * (5e-5 - was) * base.host_in_context
    assert after - before == pytest.approx(extra, rel=1e-9)


def test_unknown_category_in_a_profile_is_one_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("host_dispatch_by_kind_s = { convolution = 5e-5 }\n")
    with pytest.raises(UsageError, match="unknown op category 'convolution'; valid: gemm, conv"):
        load_profile(path, load_gpu("a100"))


def test_predict_host_option():
    def host_s(*extra):
        r = CliRunner().invoke(cli, ["predict", "mlp", "--batch", "1", "--inference", "--gpu", "a100", "--json",
                                     *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["totals"]["host_s"]

    # an MLP's inference forward: one kernel per op, so host time is dispatch time only
    default, desktop = host_s(), host_s("--host", "i9-11900k")
    assert desktop / default == pytest.approx(2.44 / 5.3, rel=1e-9)
    r = CliRunner().invoke(cli, ["predict", "mnist-cnn", "--gpu", "a100", "--host", "pentium"])
    assert r.exit_code == 2 and "unknown host 'pentium'" in r.output and "Traceback" not in r.output


def test_a_profile_from_before_the_host_parts_still_loads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text("host_dispatch_s = 8e-6\nhost_dispatch_backward_s = 1.2e-5\nhost_dispatch_optimizer_s = 4e-6\n")
    profile = load_profile(path, load_gpu("h100"))
    assert profile.host_dispatch_s == 8e-6
    # the parts it lacks keep the shipped defaults (the cloud VM's), stated in default_profile.toml,
    # and the prediction says so (never a silent default)
    assert profile.host_module_call_s == default_profile(load_gpu("h100")).host_module_call_s > 0
    assert "host_module_call_s" in profile.unmeasured_host_parts
    (note,) = profile.host_notes
    assert "not python_call_s, autograd_record_s" in note and "defaults'" in note
    doc = predict_analysis(analyze("mlp", batch=2, train=False), load_gpu("h100"), profile=profile).to_json()
    assert doc["timing_options"]["host_notes"] == [note]
    assert default_profile(load_gpu("h100")).host_notes == ()  # the defaults say where they come from


def test_a_saved_profile_keeps_what_it_did_not_measure(tmp_path):
    from nnperf.hardware.profile import save_profile

    measured = default_profile(load_gpu("h100")).replace(
        host_dispatch_s=7e-6, unmeasured_host_parts=("host_module_call_s",))
    save_profile(measured, tmp_path / "p.toml")
    again = load_profile(tmp_path / "p.toml", load_gpu("h100"))
    assert again.unmeasured_host_parts == ("host_module_call_s",) and again.host_dispatch_s == 7e-6


def test_an_unknown_optimizer_step_in_a_profile_is_one_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('host_optimizer_step_s = { "lamb/fused" = 1e-5 }\n')
    with pytest.raises(UsageError, match="unknown optimizer step 'lamb/fused'; valid: adamw/single"):
        load_profile(path, load_gpu("a100"))


CLUSTER_FILE = ('name = "mine"\ngpu = "h100-sxm"\ngpus_per_node = 8\n{host}[intra]\nlink_gbs = 450\n'
                'efficiency = 0.8\nlatency_us = 10\n[inter]\nlink_gbs = 50\nefficiency = 0.8\nlatency_us = 25\n')


def test_a_cluster_names_the_cpu_of_its_nodes(tmp_path):
    """A DGX's own CPU (its datasheet: DGX H100 and H200 2x Xeon Platinum 8480C, DGX B200 2x
    Xeon 8570, DGX A100 2x EPYC 7742); a cluster file naming none is the rented GPU's cloud VM; a host the table does
    not hold is one line naming those it does."""
    assert load_cluster("dgx-h100").host == load_cluster("dgx-h200").host == "xeon-8480c"
    assert load_cluster("dgx-a100").host == "epyc-7742"
    # DGX B200 user guide: 2x Intel Xeon 8570, 2.1/4 GHz base/max boost
    assert load_cluster("dgx-b200").host == load_host("DGX B200").id == "xeon-8570"
    assert load_host("xeon-8570").turbo_ghz == 4.0
    path = tmp_path / "mine.toml"
    path.write_text(CLUSTER_FILE.format(host=""))
    assert load_cluster(str(path)).host == "cloud-vm"
    path.write_text(CLUSTER_FILE.format(host='host = "epyc-9654"\n'))
    assert load_cluster(str(path)).host == "epyc-9654"
    path.write_text(CLUSTER_FILE.format(host='host = "DGX A100"\n'))  # as --host takes it: its system
    assert load_cluster(str(path)).host == "epyc-7742"
    path.write_text(CLUSTER_FILE.format(host='host = "epyc-9645"\n'))
    with pytest.raises(UsageError, match=r"mine.toml: field 'host': unknown host 'epyc-9645'; did you mean "
                                         r"'epyc-9654'\? valid hosts: .*cloud-vm"):
        load_cluster(str(path))


def test_a_cluster_without_a_host_is_planned_with_the_defaults_own():
    """The host a cluster file that names none gets is the one the shipped defaults were measured
    on: its costs are then used as they are."""
    assert DEFAULT_HOST == default_profile(load_gpu("h100")).host == "cloud-vm"


PLAN = ["plan", "gpt2", "-O", "n_layer=2", "--batch", "2", "--seq", "128", "--amp", "bf16", "--gpu", "h100",
        "--gpus", "8", "--tp", "1", "--pp", "1", "--data", "ddp", "--json"]


def test_a_plan_prices_the_host_of_its_cluster_or_the_one_named():
    """DGX H100 ranks issue their ops from a 3.8 GHz Xeon Platinum 8480C, not the 2.44 GHz cloud
    VM the defaults were measured on: the same layout's host time is longer by up to
    3.8 / 2.44 with --host cloud-vm (less where part of it is not the core's: a round trip to
    the device, each further kernel's launch); the JSON says whose it is; an unknown host is one line."""
    dgx = CliRunner().invoke(cli, PLAN)
    vm = CliRunner().invoke(cli, [*PLAN, "--host", "cloud-vm"])
    assert dgx.exit_code == vm.exit_code == 0, dgx.output + vm.output
    dgx_doc, vm_doc = json.loads(dgx.output), json.loads(vm.output)
    assert dgx_doc["cluster"]["host"] == "xeon-8480c" and vm_doc["cluster"]["host"] == "cloud-vm"
    on_dgx, on_vm = (d["ranked"][0]["time_split_s"]["host_s"] for d in (dgx_doc, vm_doc))
    assert 1.3 < on_vm / on_dgx <= 3.8 / 2.44 + 1e-9
    bad = CliRunner().invoke(cli, [*PLAN, "--host", "xeon-8480"])
    assert bad.exit_code == 2 and "unknown host 'xeon-8480'; did you mean 'xeon-8480c'?" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
