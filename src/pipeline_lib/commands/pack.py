"""``pack``: corpus → tokenizer → packed epoch shards in DIR (the rule ``pack_data`` calls the
same :func:`pipeline_lib.workflow.stages.data.pack_stage`)."""

from __future__ import annotations

import argparse

from ._common import CONFIG, Command, config_from_args, out

COMMAND = Command("pack", "tokenize and pack the corpus into epoch shards", (
    CONFIG, out("--out", required=True, help="data directory to create (e.g. "
                                             "results/data/<data_id>)")),
    description="Stream the configured sources, build or train the tokenizer, and write "
                "tokens.bin, docs.npy, train/epoch_*/, val/ and metadata.json into --out (a "
                "previous pack there is replaced atomically; any other non-empty directory is "
                "refused).")


def run(args: argparse.Namespace) -> int:
    from ..workflow.stages.data import pack_stage  # tokenizers, pyarrow: `--help` stays fast

    meta = pack_stage(config_from_args(args).data, args.out)
    print(f"packed {meta['num_docs']} docs, {meta['total_tokens']} tokens "
          f"(vocab {meta['vocab_size']}) into {meta['rows_per_epoch']} rows/epoch × "
          f"{meta['num_epochs']} epochs of {meta['row_len']} tokens, fill "
          f"{meta['fill_ratio']:.4f}, {meta['val_rows']} val rows, data_id "
          f"{meta['data_id']}: {args.out}")
    return 0
