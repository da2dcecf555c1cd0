"""`sync-tracking`: replay tracking outboxes into the current store (idempotent).

Without ``--run-dir``, every run directory under the results directory that holds a
``tracking_outbox.jsonl``. The store is ``--uri``, else MLFLOW_TRACKING_URI, else the
config's ``tracking.uri``. Running it twice adds nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import add_config_args, config_from_args


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "sync-tracking", help="replay offline tracking outboxes into the MLflow store")
    add_config_args(parser)
    parser.add_argument("--run-dir", type=Path, action="append", default=None,
                        help="run directory to replay (repeatable; default: all under results)")
    parser.add_argument("--uri", default=None,
                        help="target store (default: MLFLOW_TRACKING_URI, else tracking.uri)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..errors import TrackingError
    from ..tracking import outbox_dirs, sync_outbox
    from ..tracking.store import StoreUnavailable, normalize_uri, resolve_uri

    cfg = config_from_args(args)
    uri = normalize_uri(args.uri) if args.uri else resolve_uri(cfg)
    run_dirs = args.run_dir or outbox_dirs(Path(cfg.experiment.results_dir))
    if not run_dirs:
        print(f"no tracking outbox under {cfg.experiment.results_dir}; nothing to sync")
        return 0
    for run_dir in run_dirs:
        try:
            report = sync_outbox(run_dir, uri)
        except StoreUnavailable as exc:
            raise TrackingError(f"cannot reach tracking store {uri} ({exc}); start it or pass "
                                "--uri with a reachable store") from None
        print(f"{run_dir}: {report.records} records, {report.runs} runs, "
              f"{report.metrics} metric points, {report.skipped} skipped")
    return 0
