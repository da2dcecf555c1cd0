"""A stage process for the tracking tests (run as a script): logs one metric per step.

    python tracking_worker.py URI EXPERIMENT RUN_DIR STAGE RUN_ID|- FIRST LAST FLUSH_EVERY CRASH_AFTER

Logs ``worker/loss`` = step + 0.25 for steps FIRST..LAST, flushing every FLUSH_EVERY steps;
with CRASH_AFTER >= 0 it flushes through that step and then dies without ending the run
(``os._exit``: no cleanup, like a killed job). Prints the child run id.
"""

from __future__ import annotations

import os
import sys

from tracking_helpers import make_config

from pipeline_lib.tracking import start_stage


def main(argv: list[str]) -> None:
    uri, experiment, run_dir, stage_name, run_id = argv[:5]
    first, last, flush_every, crash_after = (int(a) for a in argv[5:9])
    cfg = make_config(uri, experiment)
    stage = start_stage(cfg, run_dir, stage_name, run_id=None if run_id == "-" else run_id)
    print(stage.run_id, flush=True)
    for step in range(first, last + 1):
        stage.log_metrics(step, {"worker/loss": step + 0.25})
        if flush_every and step % flush_every == 0:
            stage.flush()
    if crash_after >= 0:
        stage.flush(through_step=crash_after)
        os._exit(3)
    stage.end()


if __name__ == "__main__":
    main(sys.argv[1:])
