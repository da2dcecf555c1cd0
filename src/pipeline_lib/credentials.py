"""Credentials in a store URI: split off for use, redacted wherever the URI is written.

A tracking URI may carry a password (``http://user:secret@host:5000``,
``postgresql://user:secret@db/mlflow``). It must never reach a file, a log line, an MLflow
param or artifact. The rule of the project: every URI that is stored or shown passes
through :func:`redact_uri`, which drops the userinfo (``user:secret@``) and keeps a URI
that still names the same store, so stored URIs compare equal whatever the credentials.
:func:`redact_config` does the same for a config's ``tracking.uri`` before a config is
dumped (snapshot ``config.yaml``, parent-run params and artifact, the config hash).

Credentials reach MLflow at run time only, through its own environment variables
(:data:`USERNAME_ENV`, :data:`PASSWORD_ENV`, :data:`TOKEN_ENV`); see
:mod:`pipeline_lib.tracking.auth`.
"""

from __future__ import annotations

import copy
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
_USERINFO = re.compile(r"(?<=://)[^/@\s'\"]+@")


@dataclass(frozen=True)
class Credentials:
    """The userinfo of a URI, percent-decoded. The password never appears in its repr."""

    username: str
    password: str = field(default="", repr=False)


def split_credentials(uri: str) -> tuple[str, Credentials | None]:
    """(``uri`` without its userinfo, the credentials it carried or None)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    creds = Credentials(urllib.parse.unquote(user), urllib.parse.unquote(password))
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), creds


def redact_uri(uri: str | None) -> str | None:
    """``uri`` as it may be written or logged: without ``user:password@``."""
    return None if uri is None else split_credentials(uri)[0]


def redact_text(text: str) -> str:
    """``text`` with the userinfo of every URL in it removed (messages quoting user input)."""
    return _USERINFO.sub("", text)


def redact_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a config mapping with ``tracking.uri`` redacted (other keys untouched)."""
    out = copy.deepcopy(dict(data))
    tracking = out.get("tracking")
    if isinstance(tracking, dict) and isinstance(tracking.get("uri"), str):
        tracking["uri"] = redact_uri(tracking["uri"])
    return out
