"""The looped transformer: ``LoopedLM`` (:mod:`.looped`), the chunked loss, loop sampling,
greedy decoding. Its sizes by arithmetic on the config live in :mod:`pipeline_lib.spec.size`.

Import the submodules themselves: this package imports nothing, so ``model.loop_sampling``
loads without torch.
"""
