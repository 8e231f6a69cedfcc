"""Registry credentials the way Docker finds them, for the OCI store.

``ENGINESMITH_OCI_USERNAME`` / ``ENGINESMITH_OCI_PASSWORD`` first; else the Docker config file
(``$DOCKER_CONFIG/config.json``, default ``~/.docker/config.json``), in Docker's order: a ``credHelpers`` entry for
the host, else ``credsStore``, each a ``docker-credential-<name>`` program asked ``get`` with the host on its
standard input (what ``docker login`` stored through it); else the host's ``auths`` entry (base64 ``user:password``).
No credential found: anonymous. Every secret found is registered, so no message shows it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

from enginesmith.core.errors import UserError
from enginesmith.core.secrets import register_secret

USERNAME_ENV = "ENGINESMITH_OCI_USERNAME"
PASSWORD_ENV = "ENGINESMITH_OCI_PASSWORD"
HELPER_TIMEOUT_S = 60  # a helper may ask the desktop keyring, which may ask the user
# What Docker's helpers print (exit 1) for a host they hold nothing for: anonymous, as with docker.
_NOT_FOUND = "credentials not found"
# A helper's username for an OAuth2 identity (refresh) token rather than a password.
_IDENTITY_TOKEN_USER = "<token>"


def docker_config_file() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def credentials_for(host: str) -> tuple[str, str] | None:
    """The (user, password) to offer ``host`` (``name[:port]``), or ``None`` for anonymous access.

    Raises ``UserError`` naming the file for a Docker config that is not JSON, and naming the helper for one that
    is not installed, fails, or answers something other than Docker's credential JSON.
    """
    user, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if user and password:
        register_secret(password)
        return user, password
    config_file = docker_config_file()
    config = _read_config(config_file)
    per_host = config.get("credHelpers")
    per_host = per_host if isinstance(per_host, dict) else {}
    # A host listed with "" in credHelpers: its auths entry, whatever the store.
    helper = per_host[host] if host in per_host else config.get("credsStore")
    if helper:
        return _ask_helper(str(helper), host, config_file)
    return _from_auths(config.get("auths") or {}, host)


def _read_config(config_file: Path) -> dict[str, object]:
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"{config_file} cannot be read ({exc.strerror})", where=str(config_file),
                        hint=f"make it readable, or point DOCKER_CONFIG elsewhere, or set {USERNAME_ENV}/{PASSWORD_ENV}"
                        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{config_file} is not valid JSON ({exc})", where=str(config_file),
                        hint="fix or remove it (`docker login` writes it again), or set "
                             f"{USERNAME_ENV}/{PASSWORD_ENV}") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_file} holds no JSON object", where=str(config_file),
                        hint="fix or remove it (`docker login` writes it again)")
    return config


def _ask_helper(helper: str, host: str, config_file: Path) -> tuple[str, str] | None:
    program = f"docker-credential-{helper}"
    where = f"{config_file} (credHelpers / credsStore)"
    if shutil.which(program) is None:
        raise UserError(f"the Docker config names the credential helper {helper!r}, and {program} is not on PATH",
                        where=where, hint=f"install {program}, or set {USERNAME_ENV}/{PASSWORD_ENV}")
    try:
        answered = subprocess.run([program, "get"], input=host, capture_output=True, text=True,
                                  timeout=HELPER_TIMEOUT_S)
    except PermissionError:
        raise UserError(f"{program} cannot be run by this user", where=where,
                        hint=f"make it executable, or set {USERNAME_ENV}/{PASSWORD_ENV}") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{program} get gave no answer for {host} within {HELPER_TIMEOUT_S} s", where=where,
                        hint=f"unlock its keyring, or set {USERNAME_ENV}/{PASSWORD_ENV}") from None
    if answered.returncode != 0:
        said = (answered.stdout + answered.stderr).strip()
        if _NOT_FOUND in said.lower():
            return None
        # What it said is not shown: a failing helper may echo what it read.
        raise UserError(f"{program} get failed for {host} (exit {answered.returncode})", where=where,
                        hint=f"run `echo {host} | {program} get` to see why, or set {USERNAME_ENV}/{PASSWORD_ENV}")
    try:
        entry = json.loads(answered.stdout)
        user, secret = entry["Username"], entry["Secret"]
        if not isinstance(user, str) or not isinstance(secret, str):
            raise TypeError("Username and Secret are strings")
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{program} get answered something other than Docker's credential JSON for {host}",
                        where=where, hint=f"check {program}, or set {USERNAME_ENV}/{PASSWORD_ENV}") from None
    register_secret(secret)
    if user == _IDENTITY_TOKEN_USER:
        raise UserError(f"{program} holds an identity token for {host}, which enginesmith cannot exchange yet",
                        where=where, hint=f"set {USERNAME_ENV}/{PASSWORD_ENV} (a user and an access token)")
    return (user, secret) if user else None


def _from_auths(auths: object, host: str) -> tuple[str, str] | None:
    if not isinstance(auths, dict):
        return None
    entry = auths.get(host) or auths.get(f"https://{host}") or auths.get(f"http://{host}") or {}
    encoded = entry.get("auth") if isinstance(entry, dict) else None
    if not isinstance(encoded, str) or not encoded:
        return None
    try:
        user, _, password = base64.b64decode(encoded).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    register_secret(password)
    return (user, password) if user else None
