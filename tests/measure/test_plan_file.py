"""``measure --layout PLAN.json[:K]`` reads a plan edited by hand into typed records: every
mistake is one line naming the field, before any rank starts (each case a traceback, a silent
conversion or a message about torchrun before)."""

from __future__ import annotations

import json

import pytest

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.measure.plan_file import read_layout


def _plan(**execution) -> dict:
    layout = Execution(world=2, micro_batch=2, **execution)
    row = {"execution": layout.to_json(), "step_time_s": 0.01, "memory_bytes": 2**30,
           "per_rank_state_bytes": {"parameters": 1000}, "time_split_s": {"exposed_communication_s": {}},
           "rank": 0}
    return {"schema": "nnperf.plan/2", "model": "llama-7b", "model_options": {"n_layer": 2}, "seq_len": 16,
            "gpu": "h100-sxm", "options": {"train": True}, "ranked": [row, row]}


def _write(tmp_path, doc) -> str:
    path = tmp_path / "plan.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_an_unedited_plan_reads_back_its_layout(tmp_path):
    path = _write(tmp_path, _plan())
    read = read_layout(f"{path}:1")
    assert read.execution == Execution(world=2, micro_batch=2)
    assert (read.model, read.model_options, read.seq_len, read.gpu) == ("llama-7b", {"n_layer": 2}, 16, "h100-sxm")


def test_a_first_schema_plan_of_uneven_interleaved_stages_is_refused(tmp_path):
    """Schema 1 counted first/last_stage_layers as the model's first and last chunk: with two
    chunks per rank it names another split now, so it is one line asking for a new plan; its
    even and one-chunk layouts read as they did."""
    uneven = {"pipeline": 2, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2, "grad_accum": 2,
              "first_stage_layers": 2}
    four = {"model_options": {"n_layer": 4}}
    with pytest.raises(UsageError, match=r"schema nnperf\.plan/1 counted first/last_stage_layers as the model.s first"):
        read_layout(_write(tmp_path, _plan(**uneven) | four | {"schema": "nnperf.plan/1"}))
    assert read_layout(_write(tmp_path, _plan(**uneven) | four)).execution.first_stage_layers == 2
    assert read_layout(_write(tmp_path, _plan() | {"schema": "nnperf.plan/1"})).execution == \
        Execution(world=2, micro_batch=2)


def test_a_plan_of_end_chunks_without_a_block_reads_back(tmp_path):
    """A plan may shorten an end stage to its embedding or head alone (first_stage_layers 0 on
    one chunk a rank; Llama 3 405B's 7 blocks over 8 chunks): it reads back as planned."""
    alone = {"pipeline": 2, "pipeline_schedule": "1f1b", "grad_accum": 2, "first_stage_layers": 0}
    read = read_layout(_write(tmp_path, _plan(**alone)))
    assert read.execution.first_stage_layers == 0 and read.execution.chunk_layers(2) == (0, 2)
    with pytest.raises(UsageError, match=r"first_stage_layers is -1"):
        read_layout(_edited(lambda d: _write(tmp_path, d),
                            lambda d: d["ranked"][0]["execution"].update(alone | {"first_stage_layers": -1})))


def _edited(path_of, change) -> str:
    doc = _plan()
    change(doc)
    return path_of(doc)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["ranked"][0]["execution"].update(pipeline=0), r"ranked\[0\]\.execution\.pipeline is 0; expected a whole number from 1"),
    (lambda d: d["ranked"][0]["execution"].update(context=0), r"execution\.context is 0"),
    (lambda d: d["ranked"][0]["execution"].update(micro_batch=0), r"execution\.micro_batch is 0"),
    (lambda d: d["ranked"][0]["execution"].update(micro_batch=-2), r"execution\.micro_batch is -2"),
    (lambda d: d["ranked"][0]["execution"].update(grad_accum=2.5), r"execution\.grad_accum is 2\.5"),
    (lambda d: d["ranked"][0]["execution"].update(tensor="2"), r"execution\.tensor is the string '2'"),
    (lambda d: d["ranked"][0]["execution"].update(sequence_parallel="yes"), r"sequence_parallel is the string 'yes'; expected true or false"),
    (lambda d: d["ranked"][0]["execution"].update(data="zero9"), r"execution\.data is the string 'zero9'; expected one of ddp"),
    (lambda d: d["ranked"][0]["execution"].update(world=3, tensor=2), r"ranked\[0\]\.execution: 3 GPUs are not a multiple"),
    (lambda d: d["ranked"][0].update(execution=[1, 2]), r"ranked\[0\]\.execution is a list; expected a table"),
    (lambda d: d.update(options="adamw"), r"options is the string 'adamw'; expected a table"),
    (lambda d: d.update(model_options="x"), r"model_options is the string 'x'"),
    (lambda d: d.update(ranked="abc"), r"ranked is the string 'abc'; expected a list"),
    (lambda d: d.update(seq_len=0), r"seq_len is 0"),
    (lambda d: d["ranked"][0].update(step_time_s="fast"), r"step_time_s is the string 'fast'; expected a finite number"),
    (lambda d: d["ranked"][0]["execution"].update(token_dispatcher="nccl"),
     r"execution\.token_dispatcher is the string 'nccl'; expected one of alltoall, deepep"),
    (lambda d: d["ranked"][0]["execution"].update(token_dispatcher="deepep"), r"needs expert parallelism"),
    (lambda d: d["ranked"][0]["execution"].update(expert_tensor=0), r"execution\.expert_tensor is 0"),
], ids=["pp-0", "cp-0", "micro-batch-0", "micro-batch-negative", "accumulation-fraction", "tp-string",
        "flag-string", "unknown-engine", "world-not-a-multiple", "execution-list", "options-string",
        "model-options-string", "ranked-string", "seq-0", "figure-string", "dispatcher-unknown",
        "dispatcher-without-experts", "expert-tensor-0"])
def test_a_hand_edited_field_is_one_line_naming_it(tmp_path, change, message):
    path = _edited(lambda d: _write(tmp_path, d), change)
    with pytest.raises(UsageError, match=message):
        read_layout(path)


def test_nan_is_refused_as_the_json_is_read(tmp_path):
    text = json.dumps(_plan()).replace('"grad_accum": 1', '"grad_accum": NaN', 1)
    with pytest.raises(UsageError, match=r"holds NaN, which is no number a plan holds"):
        read_layout(_write(tmp_path, text))


@pytest.mark.parametrize("index", ["abc", "-1", "2", "1.5"])
def test_an_index_that_is_not_a_position_names_the_valid_ones(tmp_path, index):
    path = _write(tmp_path, _plan())
    with pytest.raises(UsageError, match=rf"'{index}' is not a position in the plan's 2 ranked layouts; valid: 0 to 1"):
        read_layout(f"{path}:{index}")


def test_a_binary_file_is_one_line(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(UsageError, match=r"is not a text file"):
        read_layout(str(path))
