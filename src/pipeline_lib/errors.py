"""Errors a user can cause. Each names the key or file, the bad value, and the fix.

Internal invariants use ``assert``; everything a researcher can trigger through config,
corpus or snapshot files raises one of these, so the CLI can print one clear line.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error a user can cause; the CLI prints it as one line."""


class ConfigError(PipelineError):
    """A config key is unknown, has the wrong type, or an impossible value."""


class DataError(PipelineError):
    """A corpus source or a packed data directory is missing, empty or malformed."""


class CheckpointError(PipelineError):
    """A snapshot is incomplete, corrupted, or incompatible with the requested resume."""


class TrainingError(PipelineError):
    """Training cannot continue (for example the spike guard aborted the segment)."""


class TrackingError(PipelineError):
    """The tracking store or its outbox cannot be used as configured."""


class DeviceError(PipelineError):
    """The requested device or distributed backend is not available here."""


class UsageError(PipelineError):
    """A command's input cannot be used as given (a prompt longer than the model's context,
    an output directory that holds something else)."""


class Preempted(PipelineError):
    """A segment stopped early on request (SIGTERM/SIGUSR1 or its time limit) after writing
    a resume point; a retry of the job continues from it. The CLI exits with
    :data:`PREEMPTED_EXIT` (EX_TEMPFAIL: try again)."""


PREEMPTED_EXIT = 75
