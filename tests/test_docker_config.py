"""Registry credentials found the way Docker finds them (registry/docker_config.py, #35): the environment first, then
the Docker config's per-host credential helper, its credential store, its ``auths``; and the bad inputs: a config
that is not JSON, a helper that is not installed, fails, or answers garbage. The helpers are test doubles
(tests/oci_registry.py: write_credential_helper), a program on PATH, as the real ones are."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError
from enginesmith.core.secrets import scrub
from registry.docker_config import credentials_for
from tests.oci_registry import write_credential_helper

HOST = "registry.example.com:5000"


@pytest.fixture
def docker_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Docker config directory and a bin directory on PATH for helpers; no ENGINESMITH_OCI_* set."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("ENGINESMITH_OCI_USERNAME", raising=False)
    monkeypatch.delenv("ENGINESMITH_OCI_PASSWORD", raising=False)
    (tmp_path / "docker").mkdir()
    return tmp_path


def write_docker_config(home: Path, config: dict[str, object] | str) -> Path:
    path = home / "docker" / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def basic(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_per_host_helper_wins_over_the_store_which_wins_over_auths(docker_home: Path) -> None:
    bin_dir = docker_home / "bin"
    write_credential_helper(bin_dir, "store", {HOST: ("store-user", "store-secret-0123456789"),
                                               "other.example.com": ("other", "other-secret-0123456789")})
    write_credential_helper(bin_dir, "per-host", {HOST: ("host-user", "host-secret-0123456789")})
    auths = {"auths": {HOST: basic("auths-user", "auths-secret-0123456789")}}

    write_docker_config(docker_home, {**auths, "credsStore": "store", "credHelpers": {HOST: "per-host"}})
    assert credentials_for(HOST) == ("host-user", "host-secret-0123456789")
    assert (bin_dir / "per-host.asked").read_text().split() == [HOST]

    write_docker_config(docker_home, {**auths, "credsStore": "store", "credHelpers": {"other.example.com": "per-host"}})
    assert credentials_for(HOST) == ("store-user", "store-secret-0123456789")

    # An empty helper for the host: its auths entry, as docker reads it, even with a store set.
    write_docker_config(docker_home, {**auths, "credsStore": "store", "credHelpers": {HOST: ""}})
    assert credentials_for(HOST) == ("auths-user", "auths-secret-0123456789")

    write_docker_config(docker_home, auths)
    assert credentials_for(HOST) == ("auths-user", "auths-secret-0123456789")
    assert credentials_for("elsewhere.example.com") is None
    assert "store-secret-0123456789" not in scrub("the store said store-secret-0123456789")


def test_the_environment_comes_before_any_docker_config(docker_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_docker_config(docker_home, "{ not json")
    monkeypatch.setenv("ENGINESMITH_OCI_USERNAME", "env-user")
    monkeypatch.setenv("ENGINESMITH_OCI_PASSWORD", "env-secret-0123456789")
    assert credentials_for(HOST) == ("env-user", "env-secret-0123456789")


def test_a_helper_holding_nothing_for_the_host_means_anonymous(docker_home: Path) -> None:
    write_credential_helper(docker_home / "bin", "store", {"other.example.com": ("u", "other-secret-0123456789")})
    write_docker_config(docker_home, {"credsStore": "store"})
    assert credentials_for(HOST) is None


@pytest.mark.parametrize(("config", "helper", "problem", "hint"), [
    ("{ not json", None, "config.json is not valid JSON", "docker login"),
    ("[]", None, "holds no JSON object", "docker login"),
    ({"credsStore": "nosuch"}, None, "docker-credential-nosuch is not on PATH", "install docker-credential-nosuch"),
    ({"credsStore": "broken"}, {"exit_code": 3, "output": "keyring locked: hunter2-secret"},
     "docker-credential-broken get failed", "echo registry.example.com:5000 | docker-credential-broken get"),
    ({"credsStore": "garbled"}, {"exit_code": 0, "output": "Username=someone"},
     "something other than Docker's credential JSON", "check docker-credential-garbled"),
    ({"credsStore": "nulls"}, {"exit_code": 0, "output": '{"Username": null, "Secret": "x"}'},
     "something other than Docker's credential JSON", "check docker-credential-nulls"),
])
def test_a_bad_docker_config_or_helper_is_a_clear_error_naming_it(
    docker_home: Path, config: dict[str, object] | str, helper: dict[str, object] | None, problem: str, hint: str
) -> None:
    if helper is not None:
        name = str(config["credsStore"]) if isinstance(config, dict) else ""
        write_credential_helper(docker_home / "bin", name, {}, **helper)  # type: ignore[arg-type]
    config_file = write_docker_config(docker_home, config)
    with pytest.raises(UserError, match=problem) as refused:
        credentials_for(HOST)
    assert str(config_file) in (refused.value.where or "") and hint in (refused.value.hint or "")
    assert "hunter2" not in refused.value.message  # what a failing helper printed may hold what it read


def test_an_identity_token_is_refused_with_what_to_set_instead(docker_home: Path) -> None:
    write_credential_helper(docker_home / "bin", "store", {HOST: ("<token>", "refresh-token-0123456789")})
    write_docker_config(docker_home, {"credsStore": "store"})
    with pytest.raises(UserError, match="identity token") as refused:
        credentials_for(HOST)
    assert "ENGINESMITH_OCI_USERNAME" in (refused.value.hint or "")
    assert "refresh-token-0123456789" not in scrub(f"{refused.value.message} refresh-token-0123456789")
