"""``enginesmith serve DIR``: the command that serves a built or pulled artefact with its runtime, rendered from the
artefact's serve recipe (and, for a directory pulled for an SLO, the serving profile chosen for it). The CLI prints
or runs it; this decides it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.artefacts import read_artefact, with_flags
from enginesmith.core.errors import UserError
from enginesmith.core.serving import UNRESOLVED_VLLM_CPU_PYTHON, render


class ServeCommand(BaseModel):
    """What serves the artefact: argv and the environment it adds, which runtime, and what to tell the user."""

    argv: list[str]
    env: dict[str, str]
    model_id: str
    artefact_kind: str
    runtime: str
    profile_note: str = ""  # ", profile P chosen for SLO" where a pulled profile's flags are on the command
    unresolved: str = ""  # why the runtime's interpreter is named by its variable (not installed here)


def serve_command(artefact_dir: Path, *, host: str, port: int, runtime: str | None,
                  allow_unresolved: bool) -> ServeCommand:
    """The command serving ``artefact_dir``. Where its runtime is not installed here, a UserError, or with
    ``allow_unresolved`` the command naming the runtime's python by its variable (``UNRESOLVED_VLLM_CPU_PYTHON``)."""
    from registry.pull import read_pull_record

    artefact = read_artefact(artefact_dir)
    if artefact is None:
        raise UserError("not an artefact directory (no artefact.json)", where=str(artefact_dir),
                        hint="build one with `enginesmith build`, or pull one with `enginesmith pull`")
    recipes = {r.runtime: r for r in artefact.serve}
    if not recipes:
        raise UserError("the artefact has no serve recipe", where=str(artefact_dir))
    if runtime is not None and runtime not in recipes:
        raise UserError(f"the artefact has no {runtime!r} runtime", where="--runtime",
                        hint=f"it has: {', '.join(recipes)}")
    chosen = recipes[runtime] if runtime else artefact.serve[0]
    # A directory pulled for an SLO serves the profile chosen for it (its flags on the recipe it was measured on).
    record = read_pull_record(artefact_dir)
    profile = record.profile if record is not None and record.profile is not None else None
    profile_flags = profile.args if profile is not None and profile.runtime == chosen.runtime else []

    def rendered(resolve_runtime: bool) -> tuple[list[str], dict[str, str]]:
        argv, env = render(chosen, artefact_dir=artefact_dir.resolve(), host=host, port=port,
                           model_name=artefact.lineage.model_id, resolve_runtime=resolve_runtime)
        return with_flags(argv, profile_flags), env

    unresolved = ""
    try:
        argv, env = rendered(resolve_runtime=True)
    except UserError as exc:  # the runtime is not installed here
        if not allow_unresolved:
            raise UserError(f"the artefact is served by {chosen.runtime}: {exc.message}", where=exc.where,
                            hint=exc.hint) from None
        unresolved = (f"{exc.message}; the command names the runtime's python as {UNRESOLVED_VLLM_CPU_PYTHON} "
                      f"({exc.hint or ''})")
        argv, env = rendered(resolve_runtime=False)
    with_profile = f", profile {profile.name} chosen for {profile.slo}" if profile_flags and profile else ""
    return ServeCommand(argv=argv, env=env, model_id=artefact.lineage.model_id, artefact_kind=artefact.kind,
                        runtime=chosen.runtime, profile_note=with_profile, unresolved=unresolved)
