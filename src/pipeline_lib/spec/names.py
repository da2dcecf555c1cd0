"""Names and constants shared across the floors, defined once here and imported by everyone.

Torch-free like the rest of :mod:`pipeline_lib.spec`, so the Snakefile's plan and the torch
code read the same values. (File names of a run directory are :mod:`.layout`'s.) The one
exception is ``export/modeling_loopline.py``, which ships standalone beside exported
weights and imports only torch and transformers: it spells :data:`IGNORE_INDEX` as -100.
"""

from __future__ import annotations

import re

# A target no loss counts (document boundaries, padding, non-answer tokens of an answer-only
# objective): the value torch.nn.functional.cross_entropy ignores by default.
IGNORE_INDEX = -100

# The byte-level tokenizer: 256 bytes, then these special tokens, in this order.
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)
BYTE_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
TOKENIZER_FILE = "tokenizer.json"  # in a data pack, and a copy in every snapshot

# The built-in reasoning generators (data source ``reasoning``) and the lm-eval tasks made of
# them (``loopline_khop``, …), which bench.tasks writes and the planner checks.
REASONING_TASKS = ("khop", "addition", "parity")
BUILTIN_TASK_PREFIX = "loopline_"
BUILTIN_TASK_NAMES = tuple(BUILTIN_TASK_PREFIX + t for t in REASONING_TASKS)
# lm-eval metric of tasks that sample several answers: pass@k and maj@k (bench.sampled)
SAMPLES_METRIC = "loopline_samples"
# The built-in sequence-labelling generators (data source ``labelled`` without a path).
LABELLED_TASKS = ("prefix_parity", "chain_root")

# Files that say what a directory is (commands refuse to write into such a directory).
MANIFEST_NAME = "MANIFEST.json"  # a snapshot's file list and checksums, written last
PACK_METADATA = "metadata.json"  # a data pack's description and array checksums
PACK_TOKENS = "tokens.bin"  # a data pack's documents, back to back
PACK_LABELS = "labels.bin"  # a labelled pack's label of every token of tokens.bin (int32)
CONFIG_JSON = "config.json"  # a Hugging Face model's config (export writes it, import reads it)
MODELING_FILE = "modeling_loopline.py"  # the export's self-contained modelling code
RUN_NAME_PATTERN = r"^(?!data$|compare$)[A-Za-z_][A-Za-z0-9_]*$"  # runs: names; not data/compare


def is_name(text: str, pattern: str | re.Pattern[str]) -> bool:
    """Whether ``pattern`` matches the whole of ``text``: the test of every name checked
    against a pattern (run names, metric keys, a snapshot's extra file names). Never
    ``re.match`` with ``$``: ``$`` also matches before a final newline, so ``"base\\n"``
    passed for a run name."""
    return isinstance(text, str) and re.fullmatch(pattern, text) is not None
