"""Pack verification: what checking a pack costs a training segment.

Packs the demo's data config (``config/config.yaml``), or measures ``--data DIR``, then
times, best of ``--repeats`` each (page cache warm: the pack was just written or read):

- ``hash``: every file hashed against metadata.json (``PackedData.verify()``): what the
  first segment after packing (or after any file of the pack changed) pays, once;
- ``check``: the verified-once marker trusted (one ``stat`` per file): what every later
  segment pays;
- ``open``: constructing ``PackedData`` with the marker valid, the whole cost a later
  segment sees (metadata, the check, memory maps).

Usage: ``python benchmarks/bench_verify.py [--data DIR] [--repeats N]``.
Last line: JSON with ``check_over_hash`` and the hash throughput in MB/s (the first
segment's cost at scale is the pack size over that figure).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from pipeline_lib.data import verify  # noqa: E402
from pipeline_lib.data.loader import PackedData  # noqa: E402
from pipeline_lib.data.pack import pack_corpus  # noqa: E402
from pipeline_lib.diagnostics.timing import best_s  # noqa: E402
from pipeline_lib.spec.config_load import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def measure(data_dir: Path, repeats: int) -> dict:
    verify.TIMESTAMP_SLACK_S = 0.0  # the files were just written: record them anyway
    data = PackedData(data_dir)  # verifies and writes the marker
    hashes = verify.expected_hashes(data_dir, data.metadata)
    size = sum((data_dir / rel).stat().st_size for rel in hashes)
    hash_s = best_s(data.verify, repeats)
    check = verify.verify_pack(data_dir, data.metadata)
    assert not check.hashed, "the marker should vouch for every file"
    check_s = best_s(lambda: verify.verify_pack(data_dir, data.metadata), repeats)
    open_s = best_s(lambda: PackedData(data_dir), repeats)
    return {"files": len(hashes), "bytes": size, "hash_s": hash_s, "check_s": check_s,
            "open_s": open_s, "check_over_hash": check_s / hash_s,
            "hash_mb_per_s": size / hash_s / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="an existing pack to measure")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            data_dir = Path(tmp) / "demo"
            start = time.perf_counter()
            pack_corpus(load_config(ROOT / "config" / "config.yaml").data, data_dir)
            print(f"packed the demo data config in {time.perf_counter() - start:.1f} s")
        result = measure(data_dir, args.repeats)
    print(f"{result['files']} files, {result['bytes'] / 1e6:.1f} MB")
    print(f"first segment (hash everything): {result['hash_s'] * 1e3:.1f} ms "
          f"({result['hash_mb_per_s']:.0f} MB/s)")
    print(f"later segments (marker, stat only): {result['check_s'] * 1e3:.2f} ms; opening the "
          f"pack with it: {result['open_s'] * 1e3:.2f} ms")
    print(f"check / hash: {result['check_over_hash']:.4f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
