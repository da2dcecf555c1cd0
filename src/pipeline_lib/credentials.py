"""Credentials in a store URI: split off for use, redacted wherever the URI is written.

A tracking URI may carry a secret in two places: its userinfo (``http://user:secret@host``,
``postgresql://user:secret@db/mlflow``) and its query (``postgresql://db/mlflow?password=…``,
``…?token=…``, ``…?sig=…``). Neither may reach a file, a log line, an MLflow param or
artifact, or a message. The rule of the project: every URI that is stored or shown passes
through :func:`redact_uri`, which drops the userinfo and replaces the value of every query
parameter (and a fragment) with :data:`REDACTED`. Every value, not a list of secret-looking
names: a store URI has no query that anyone needs to read back (MLflow's HTTP client cannot
send one at all, and a database driver's options are the user's own config), while a name
list misses the next spelling of a secret. The result still names the same store, so
stored URIs compare equal whatever the credentials. :func:`redact_config` does the same for
a config's ``tracking.uri`` before a config is dumped (snapshot ``config.yaml``,
``specs/{digest}.yaml``, parent-run params and artifact, the config hash); :func:`redact_text`
and :func:`error_line` for free text that may quote a URI (an error of MLflow or a database
driver, an override list quoted back).

The real URI stays in memory, for the MLflow client only. Credentials of a server reach
MLflow through its own environment variables (:data:`USERNAME_ENV`, :data:`PASSWORD_ENV`,
:data:`TOKEN_ENV`); see :mod:`pipeline_lib.tracking.auth`.
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
REDACTED = "***"  # what a query value or fragment is written as
# A URL inside free text: a scheme (bounded: linear time on long runs of letters), "://",
# then anything up to a space or a quote (:func:`redact_text` gives back the punctuation
# that closes a sentence or a bracket around it).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>`]*")
_CLOSING = ".,;:!)]}"
_USERINFO = re.compile(r"(?<=://)[^/?#@]*@")


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


def _redact_query(query: str) -> str:
    """``a=1&b=2`` → ``a=***&b=***``; a part without ``=`` is a value itself."""
    out = []
    for item in query.split("&"):
        name, eq, value = item.partition("=")
        out.append(f"{name}={REDACTED}" if eq and value else item if eq else
                   REDACTED if item else item)
    return "&".join(out)


def redact_uri(uri: str | None) -> str | None:
    """``uri`` as it may be written or logged: no ``user:password@``, every query value
    and a fragment replaced with :data:`REDACTED` (see the module docstring)."""
    if uri is None:
        return None
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:  # unparsable (a bad IPv6 host): cut everything that may be secret
        cut = re.search(r"[?#]", uri)
        head = _USERINFO.sub("", uri[:cut.start()] if cut else uri)
        return f"{head}{cut.group(0)}{REDACTED}" if cut else head
    after_scheme = uri[len(parts.scheme) + 1:] if parts.scheme else uri
    host = parts.netloc.rsplit("@", 1)[-1]
    # put together by hand: urlunsplit turns sqlite:///x into sqlite:/x
    out = f"{parts.scheme}:" if parts.scheme else ""
    out += f"//{host}" if after_scheme.startswith("//") else ""
    out += parts.path
    if parts.query:
        out += f"?{_redact_query(parts.query)}"
    if parts.fragment:
        out += f"#{REDACTED}"
    return out


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_uri`): messages quoting user
    input or another library's error."""
    def redact(match: re.Match[str]) -> str:
        url = match.group(0).rstrip(_CLOSING)
        if url.endswith(("=", "?", "&", "#")):  # the punctuation is the value itself
            url = match.group(0)
        return f"{redact_uri(url)}{match.group(0)[len(url):]}"

    return _URL_IN_TEXT.sub(redact, text)


def error_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of ``exc``'s text (its type's name when empty) with every URL
    redacted, then cut to ``limit`` characters: how an error of MLflow or a database
    driver, whose text may quote the store URI, is logged or put into a message."""
    text = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return redact_text(text)[:limit]


def redact_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a config mapping with ``tracking.uri`` redacted (other keys untouched)."""
    out = copy.deepcopy(dict(data))
    tracking = out.get("tracking")
    if isinstance(tracking, dict) and isinstance(tracking.get("uri"), str):
        tracking["uri"] = redact_uri(tracking["uri"])
    return out
