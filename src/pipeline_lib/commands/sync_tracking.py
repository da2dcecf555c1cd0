"""`sync-tracking`: replay tracking outboxes into the current store (idempotent).

Without ``--run-dir``, every run directory under the results directory that holds a
``tracking_outbox.jsonl``. The store is ``--uri``, else MLFLOW_TRACKING_URI, else the
config's ``tracking.uri``. Running it twice adds nothing.

Only files inside each run directory are uploaded: an ``artifact`` record naming a file
outside it is refused with an error line naming the record and the file; the other
records are synced, and the command then fails (exit status 2) with the first refusal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..credentials import redact_uri
from ..errors import TrackingError
from ..output_paths import SQLITE, Output, check_outputs
from ..tracking import outbox_dirs, sync_outbox
from ..tracking.health import check_sqlite_file
from ..tracking.store import StoreUnavailable, resolve_uri, sqlite_path, store_uri
from ._common import CONFIG, Command, arg, config_from_args

COMMAND = Command("sync-tracking", "replay offline tracking outboxes into the MLflow store", (
    CONFIG,
    arg("--run-dir", type=Path, action="append", default=None,
        help="run directory to replay (repeatable; default: all under results)"),
    arg("--uri", default=None,
        help="target store (default: MLFLOW_TRACKING_URI, else tracking.uri)")))


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    uri = store_uri(args.uri) if args.uri else resolve_uri(cfg)
    for run_dir in args.run_dir or ():
        if not run_dir.is_dir():
            raise TrackingError(f"--run-dir {run_dir} is not a directory; pass a run directory "
                                "(results/<run>) holding a tracking outbox")
    db = sqlite_path(uri)
    if db is not None:  # before any outbox is read: a store that can be opened or made
        check_sqlite_file(db)
        check_outputs([Output(db, "tracking store", SQLITE)],
                      [("--run-dir", run_dir) for run_dir in args.run_dir or ()])
    run_dirs = args.run_dir or outbox_dirs(Path(cfg.experiment.results_dir))
    if not run_dirs:
        print(f"no tracking outbox under {cfg.experiment.results_dir}; nothing to sync")
        return 0
    refused: list[str] = []
    for run_dir in run_dirs:
        try:
            report = sync_outbox(run_dir, uri)
        except StoreUnavailable as exc:
            raise TrackingError(f"cannot reach tracking store {redact_uri(uri)} ({exc}); start "
                                "it or pass --uri with a reachable store") from None
        refused += report.refused
        print(f"{run_dir}: {report.records} records, {report.runs} runs, "
              f"{report.metrics} metric points, {report.skipped} skipped"
              + (f" ({len(report.refused)} refused)" if report.refused else ""))
    if refused:
        more = f" and {len(refused) - 1} more (see the log)" if len(refused) > 1 else ""
        raise TrackingError(f"{refused[0]}{more}; the other records were synced; remove such "
                            "lines from the outbox (sync-tracking uploads only files inside "
                            "the run directory)")
    return 0
