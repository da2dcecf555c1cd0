"""The looped transformer: ``LoopedLM`` (:mod:`.looped`), the chunked loss, sizes, loop
sampling, greedy decoding.

Import the submodules themselves: this package imports nothing, so ``model.size`` and
``model.loop_sampling`` load without torch (the Snakefile computes step counts from
``param_count`` on every call).
"""
