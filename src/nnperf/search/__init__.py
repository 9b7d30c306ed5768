"""Drivers that trace or predict many variants of one workload.

A pass looks at one trace; a search asks "what if" and needs many: ``fit`` (the largest batch
that fits, and what mixed precision, checkpointing or a stateless optimizer change), the memory
variants it traces (``memory_variants``: checkpointing, accumulation), their replay and parallel
runner. The advice and parallelism-planner searches belong here too.
"""
