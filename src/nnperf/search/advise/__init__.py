"""``nnperf advise``: what to change, each change re-predicted on the same workload.

One module per family of advice (``padding``, ``batch``, ``precision``, ``optimizer``,
``graphs``, ``inductor`` for torch.compile, ``layout``, ``attention``, ``recompute``, ``gpus``),
each saying which of its changes apply to the traced model; ``evaluate`` predicts a change
(re-traced or re-timed), ``driver`` runs them and ranks the gains.
"""

from nnperf.search.advise.change import Candidate, Change, Outcome
from nnperf.search.advise.driver import advise, advise_request
from nnperf.search.advise.result import Advice, AdviceItem

__all__ = ["Advice", "AdviceItem", "Candidate", "Change", "Outcome", "advise", "advise_request"]
