"""Packing benchmark: speed and density of best-fit-decreasing, and the whole pack stage.

Three measurements, side by side in one run (ratios, not absolute times, are the claim):

1. ``pack_documents`` (split + seeded tie shuffle + BFD + row permutation + grouping) on
   1M log-normal document lengths (median 256 tokens, σ = 1, rows of 1025 tokens), against
   ``numpy.argsort`` of the same lengths, each the best of 5 calls. Targets: fill ≥ 0.999,
   pack / argsort ≤ 20.
2. ``pack_corpus`` on the embedded default config (config/config.yaml): tokens/s end to end.
3. ``pack_corpus`` on a generated ~200 MB Parquet corpus in a subprocess, reporting that
   process's peak RSS: packing streams, so it must stay under 1 GB.

Usage: ``python benchmarks/bench_packing.py [--docs N] [--corpus-mb MB] [--skip-corpus]``.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.data.packing import fill_ratio, pack_documents
from pipeline_lib.diagnostics.timing import best_s
from pipeline_lib.spec.config_load import load_config

SEQ_LEN = 1024

# Run in a fresh interpreter so its peak RSS is the pack's alone.
CHILD = """
import json, resource, sys, time
from pathlib import Path
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.data.pack import pack_corpus
glob, out = sys.argv[1], Path(sys.argv[2])
data = DataConfig(sources=[SourceConfig(type="parquet", path=glob)], seq_len=1024, epochs=1)
start = time.perf_counter()
meta = pack_corpus(data, out)
seconds = time.perf_counter() - start
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"tokens": meta["total_tokens"], "docs": meta["num_docs"],
                  "seconds": seconds, "peak_rss_mb": peak_kb / 1024}))
"""


def bench_bfd(num_docs: int) -> dict:
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(256), 1.0, num_docs))).astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    row_len = SEQ_LEN + 1
    argsort_s = best_s(lambda: np.argsort(lengths), 5)
    pack_s = best_s(lambda: pack_documents(starts, lengths, row_len,
                                              np.random.default_rng(1)), 3)
    packed = pack_documents(starts, lengths, row_len, np.random.default_rng(1))
    fill = fill_ratio(packed, row_len)
    print(f"BFD: {num_docs} docs ({len(packed.piece_len)} pieces) → {packed.num_rows} rows of "
          f"{row_len}, fill {fill:.5f}; pack {pack_s:.3f} s, argsort {argsort_s:.4f} s, "
          f"ratio {pack_s / argsort_s:.1f}")
    return {"fill_ratio": fill, "docs_per_s": num_docs / pack_s,
            "ratio_to_argsort": pack_s / argsort_s, "pack_seconds": pack_s,
            "argsort_seconds": argsort_s, "num_docs": num_docs, "seq_len": SEQ_LEN}


def bench_default_corpus(tmp: Path) -> dict:
    data = load_config().data
    start = time.perf_counter()
    meta = pack_corpus(data, tmp / "default")
    seconds = time.perf_counter() - start
    print(f"default corpus: {meta['num_docs']} docs, {meta['total_tokens']} tokens in "
          f"{seconds:.2f} s ({meta['total_tokens'] / seconds:,.0f} tokens/s), fill "
          f"{meta['fill_ratio']:.5f}")
    return {"default_corpus_tokens": meta["total_tokens"], "default_corpus_seconds": seconds,
            "default_corpus_tokens_per_s": meta["total_tokens"] / seconds}


def write_corpus(root: Path, target_mb: int) -> float:
    """Parquet files of random-word documents (log-normal lengths); returns text MB written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = ["".join(map(chr, rng.choice(letters, rng.integers(2, 10)))) for _ in range(5000)]
    pool = " ".join(rng.choice(words, 1_000_000)) + "\n"  # ~6 MB of text to slice from
    root.mkdir(parents=True)
    total, file_index = 0, 0
    while total < target_mb << 20:
        lens = np.minimum(len(pool) - 1, np.round(rng.lognormal(np.log(3000), 1.0, 5000)))
        offsets = rng.integers(0, len(pool) - lens)
        docs = [pool[o:o + int(n)] for o, n in zip(offsets, lens, strict=True)]
        total += sum(map(len, docs))
        pq.write_table(pa.table({"text": docs}), root / f"part_{file_index:03d}.parquet",
                       row_group_size=1000)
        file_index += 1
    return total / (1 << 20)


def bench_large_corpus(tmp: Path, target_mb: int) -> dict:
    text_mb = write_corpus(tmp / "corpus", target_mb)
    disk_mb = sum(p.stat().st_size for p in (tmp / "corpus").iterdir()) / (1 << 20)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp / "corpus" / "*.parquet"),
                           str(tmp / "large")], capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{text_mb:.0f} MB corpus ({disk_mb:.0f} MB Parquet): {child['tokens']} tokens in "
          f"{child['seconds']:.1f} s ({child['tokens'] / child['seconds']:,.0f} tokens/s), "
          f"peak RSS {child['peak_rss_mb']:.0f} MB")
    return {"corpus_text_mb": text_mb, "corpus_tokens": child["tokens"],
            "corpus_tokens_per_s": child["tokens"] / child["seconds"],
            "corpus_peak_rss_mb": child["peak_rss_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--corpus-mb", type=int, default=200)
    parser.add_argument("--skip-corpus", action="store_true", help="only the BFD measurement")
    args = parser.parse_args()
    result = bench_bfd(args.docs)
    if not args.skip_corpus:
        with tempfile.TemporaryDirectory(prefix="bench_packing_") as tmp:
            result |= bench_default_corpus(Path(tmp))
            result |= bench_large_corpus(Path(tmp), args.corpus_mb)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
