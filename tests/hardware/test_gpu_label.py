"""A GPU's header label says what changed it from the catalog card: --set what-ifs and a
user's GPU file, so a saved table is not read as the stock card's."""

from __future__ import annotations

from nnperf.hardware import load_gpu
from nnperf.hardware.catalog import GPU_DIR


def test_a_catalog_card_is_its_name():
    gpu = load_gpu("h100-sxm")
    assert gpu.label == gpu.name


def test_what_ifs_and_user_files_are_named(tmp_path):
    assert load_gpu("h100-sxm", overrides={"memory_bandwidth_gbs": "6700"}).label.endswith(
        "(with --set memory_bandwidth_gbs=6700)")
    text = (GPU_DIR / "h100-sxm.toml").read_text()
    mine = tmp_path / "mine.toml"
    mine.write_text("\n".join('name = "My H100"' if line.startswith("name =") else
                              'aliases = ["myh"]' if line.startswith("aliases") else line
                              for line in text.splitlines()))
    label = load_gpu("myh", gpu_file=mine).label
    assert label.startswith("My H100 (from ") and "mine.toml" in label
