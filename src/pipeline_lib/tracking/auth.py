"""Credentials for a tracking server, given to MLflow at run time and never written.

MLflow authenticates to a server from its environment: ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD`` (HTTP basic auth; else the ``[mlflow]`` section of
``~/.mlflow/credentials``), or ``MLFLOW_TRACKING_TOKEN`` (a bearer token). A server URI
that carries ``user:password@`` is accepted too: :func:`use_uri_credentials` moves the
credentials into those variables for this process (and the processes it starts), and
every caller then holds the URI without them, so MLflow, its log lines and everything
this project writes see only the bare URI (:func:`pipeline_lib.credentials.redact_uri`).

:func:`auth_header` builds the same ``Authorization`` header MLflow would send, for the
reachability probe, which does not go through MLflow.
"""

from __future__ import annotations

import base64
import configparser
import os
from pathlib import Path

from ..credentials import PASSWORD_ENV, TOKEN_ENV, USERNAME_ENV, Credentials, split_credentials

CREDENTIALS_FILE = Path("~/.mlflow/credentials")  # MLflow's own fallback file


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def use_uri_credentials(uri: str) -> str:
    """A server ``uri`` without its userinfo; its credentials, if any, set in MLflow's
    environment variables (they take precedence over ones set before: the URI is the more
    specific). Other stores are returned unchanged: a SQL store needs its password in the
    URI, so callers write such URIs only through ``redact_uri``."""
    if not is_server(uri):
        return uri
    bare, creds = split_credentials(uri)
    if creds is not None:
        os.environ[USERNAME_ENV] = creds.username
        os.environ[PASSWORD_ENV] = creds.password
    return bare


def _file_credentials() -> tuple[str | None, str | None]:
    path = CREDENTIALS_FILE.expanduser()
    if not path.is_file():
        return None, None
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        return None, None
    if "mlflow" not in parser:
        return None, None
    section = parser["mlflow"]
    return section.get(USERNAME_ENV.lower()), section.get(PASSWORD_ENV.lower())


def auth_header(uri_creds: Credentials | None = None) -> str | None:
    """The ``Authorization`` header MLflow sends: basic auth when a username and password
    are known (from ``uri_creds``, else the environment, else the credentials file), else a
    bearer token from ``MLFLOW_TRACKING_TOKEN``; None without credentials."""
    if uri_creds is not None and uri_creds.username and uri_creds.password:
        user, password = uri_creds.username, uri_creds.password
    else:
        file_user, file_password = _file_credentials()
        user = os.environ.get(USERNAME_ENV) or file_user
        password = os.environ.get(PASSWORD_ENV) or file_password
    if user and password:
        return "Basic " + base64.standard_b64encode(f"{user}:{password}".encode()).decode()
    token = os.environ.get(TOKEN_ENV)
    return f"Bearer {token}" if token else None
