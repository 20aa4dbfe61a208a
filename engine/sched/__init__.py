"""Scheduling: which tokens of which requests run in a step.

``interface`` (the scheduled batch and the ``Scheduler`` ABC both schedulers implement) <-
``v0`` (vLLM v0: prefill or decode steps, swap) / ``v1`` (vLLM v1: one token budget, chunked
prefill);
``registry`` maps ``EngineConfig.semantics`` to a scheduler and its cache manager, as vLLM picks
its scheduler class.
"""
