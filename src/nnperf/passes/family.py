"""Which kind of network a traced step is: the model family, read from its forward ops.

A prediction's track record (``nnperf.accuracy``) compares it with measured runs of the same
family, because nnperf's error is a property of the kernels a family runs: CNN steps are
convolutions, batch norm and pooling; decoders are GEMMs, causal attention and a vocabulary
projection; encoders the same with bidirectional attention and short, host-bound steps. A zoo
model states its family (``ModelSpec.family``); a library (``hf:``, ``timm:``, ``tv:``) or
user model is classified here from the trace, so any model gets one.
"""

from __future__ import annotations

from collections.abc import Sequence

from nnperf.passes.costs import registry as cat
from nnperf.passes.count import OpCount
from nnperf.trace.events import OpEvent, TensorMeta, Trace
from nnperf.vocab import Phase

#: The families ``trace_family`` answers (the zoo's five and three it has no model of).
FAMILIES = ("cnn", "decoder", "encoder", "vision-transformer", "mlp", "encoder-decoder", "rnn", "other")
#: Share of the forward FLOPs in convolutions above which a network is a CNN whatever else it
#: has (a U-Net with a few attention blocks, a CNN with a squeeze-excitation MLP).
CONV_MAJORITY = 0.5
#: Root class names that say a language model predicts the next token (Hugging Face's naming:
#: ``GPT2LMHeadModel``, ``LlamaForCausalLM``), for attention whose causality the trace cannot read.
CAUSAL_CLASS_WORDS = ("ForCausalLM", "LMHeadModel")
_CONVOLUTION = "aten.convolution"
_EMBEDDING = ("aten.embedding", "aten.embedding_bag", "aten._embedding_bag")
_RNN = "nnperf.cudnn_rnn"


def trace_family(trace: Trace, ops: Sequence[OpCount]) -> str:
    """The family of the network ``ops`` (the counts of ``trace``) runs, from its forward ops:

    1. more than half the forward FLOPs in convolutions: ``cnn``;
    2. attention (fused scaled-dot-product or FlexAttention, or an eager softmax over a score
       tensor of 3 or more dimensions: classifiers and MoE routers soft-max 2-D logits):
       with token embeddings (an ``embedding`` lookup of integer ids), ``encoder-decoder``
       where one embedding table is looked up twice (T5's and BART's encoder and decoder share
       it) or causal and bidirectional attention are both present, ``decoder`` where the
       attention is causal, ``encoder`` where it is bidirectional. Causality is read from the fused
       kernel's ``is_causal``; where the trace cannot read it (an explicit mask, an eager
       softmax) a root class named as Hugging Face names language models (``...ForCausalLM``,
       ``...LMHeadModel``) says causal, anything else bidirectional. Without token
       embeddings, a patch embedding (a convolution whose stride equals its kernel, each
       patch seen once) makes it a ``vision-transformer``; anything else is ``other``;
    3. no attention: a recurrent layer makes it ``rnn``, any convolution ``cnn`` (ConvNeXt:
       its pointwise layers are ``nn.Linear``, so its convolutions hold few of its FLOPs),
       an embedding ``other`` (a recommender's lookups), GEMMs holding most FLOPs ``mlp``;
       else ``other``.

    Only forward ops are read, so training and inference of one network get one family.
    """
    forward = [o for o in ops if o.event.phase == Phase.FORWARD and not o.event.recomputed]
    flops = sum(o.flops for o in forward)
    conv_flops = sum(o.flops for o in forward if o.category == cat.CONV)
    if flops and conv_flops / flops > CONV_MAJORITY:
        return "cnn"
    names = {o.event.name for o in forward}
    attention = _attention_kinds(trace, forward)
    if attention:
        if names & set(_EMBEDDING):
            if _shared_embedding(forward) or {"causal", "bidirectional"} <= attention:
                return "encoder-decoder"
            if "causal" in attention:
                return "decoder"
            return "encoder"
        if any(_patchifies(o.event) for o in forward if o.event.name == _CONVOLUTION):
            return "vision-transformer"
        return "other"
    if _RNN in names:
        return "rnn"
    if _CONVOLUTION in names:
        return "cnn"
    if names & set(_EMBEDDING):
        return "other"
    gemm_flops = sum(o.flops for o in forward if o.category == cat.GEMM)
    return "mlp" if flops and gemm_flops / flops > 0.5 else "other"


def _attention_kinds(trace: Trace, forward: Sequence[OpCount]) -> set[str]:
    """"causal" and/or "bidirectional" for each attention of the forward pass."""
    causal_by_name = any(w in trace.module_types.get("", "") for w in CAUSAL_CLASS_WORDS)
    unread = "causal" if causal_by_name else "bidirectional"
    kinds = set()
    for o in forward:
        if o.category == cat.ATTENTION:
            if o.info.get("causal"):
                kinds.add("causal")
            elif "causal" in o.info and not o.info.get("masked"):
                kinds.add("bidirectional")
            else:  # an explicit mask (causal or padding) or FlexAttention's mask_mod
                kinds.add(unread)
        elif o.event.name == "aten._softmax" and _is_scores(o.event):
            kinds.add(unread)
    return kinds


def _shared_embedding(forward: Sequence[OpCount]) -> bool:
    """One embedding table looked up by two lookups: a sequence-to-sequence model's encoder and
    decoder inputs (a model's own positions use tables of their own)."""
    tables = [o.event.args[0].storage for o in forward
              if o.event.name == "aten.embedding" and isinstance(o.event.args[0], TensorMeta)]
    return len(tables) != len(set(tables))


def _is_scores(event: OpEvent) -> bool:
    x = event.inputs[0] if event.inputs else None
    return isinstance(x, TensorMeta) and len(x.shape) >= 3


def _patchifies(event: OpEvent) -> bool:
    """A convolution that cuts its input into non-overlapping patches: stride == kernel > 1."""
    weight = event.args[1] if len(event.args) > 1 else None
    stride = event.args[3] if len(event.args) > 3 else None
    if not isinstance(weight, TensorMeta) or not stride or len(weight.shape) < 3:
        return False
    kernel = tuple(weight.shape[2:])
    stride = tuple(int(s) for s in stride)
    if len(stride) == 1:
        stride = stride * len(kernel)
    return kernel == stride and max(kernel) > 1
