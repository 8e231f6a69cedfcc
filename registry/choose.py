"""Which artefact a command takes: the one a reference names, or the resolver's choice for this machine."""

from __future__ import annotations

from pydantic import BaseModel

from registry.catalog import UnreadableManifest, find_manifest, list_model
from registry.errors import NotFoundError
from registry.manifest import Manifest
from registry.names import Ref
from registry.resolve import Candidate, Constraints, Machine, Resolution, assess, resolve
from registry.signing import Trust
from registry.store import RegistryStore


class ModelResolution(BaseModel):
    resolution: Resolution
    unreadable: list[UnreadableManifest]  # manifests that could not be assessed (and why)


class NothingRunsHere(NotFoundError):
    """A bare model with no artefact eligible on the machine; ``resolution`` says why each one lost."""

    def __init__(self, message: str, *, resolution: Resolution, where: str, hint: str) -> None:
        super().__init__(message, where=where, hint=hint)
        self.resolution = resolution


class Choice(BaseModel):
    manifest: Manifest
    candidate: Candidate  # its status on the machine: a named artefact may be pulled even when not runnable


def resolve_model(store: RegistryStore, model: str, machine: Machine, constraints: Constraints,
                  trust: Trust | None = None) -> ModelResolution:
    """Every published artefact of ``model`` assessed on ``machine``, best first; with ``trust``, each signature
    checked (an artefact whose signature does not hold is ``untrusted``)."""
    listing = list_model(store, model, with_channels=False)
    signers, untrusted = check_signatures(store, listing.manifests, trust)
    return ModelResolution(resolution=resolve(model, listing.manifests, machine, constraints, signers=signers,
                                              untrusted=untrusted),
                           unreadable=listing.unreadable)


def check_signatures(store: RegistryStore, manifests: list[Manifest],
                     trust: Trust | None) -> tuple[dict[str, str], dict[str, str]]:
    """For a trust list: each manifest's trusted signer, or why its signature does not hold (by key)."""
    from registry.errors import SignatureError
    from registry.signing import verify_stored

    signers: dict[str, str] = {}
    untrusted: dict[str, str] = {}
    for manifest in manifests if trust is not None else []:
        assert trust is not None
        try:
            signers[manifest.key] = verify_stored(store, manifest, trust).signer
        except SignatureError as refused:
            untrusted[manifest.key] = refused.message
    return signers, untrusted


def choose(store: RegistryStore, ref: Ref, machine: Machine, constraints: Constraints,
           trust: Trust | None = None) -> Choice:
    """The manifest ``ref`` names (``MODEL@KEY``, ``MODEL:CHANNEL``), or for a bare ``MODEL`` the best runnable one
    (with ``trust``: among those whose signature holds; a named one is checked when it is pulled).

    Raises ``NothingRunsHere`` when a bare model has nothing that can run on ``machine``, with the reasons.
    """
    if ref.names_one_manifest:
        manifest = find_manifest(store, ref)
        return Choice(manifest=manifest, candidate=assess(manifest, machine, constraints))
    listing = list_model(store, ref.model, with_channels=False)
    signers, untrusted = check_signatures(store, listing.manifests, trust)
    resolution = resolve(ref.model, listing.manifests, machine, constraints, signers=signers, untrusted=untrusted)
    if resolution.chosen is None:
        why = "; ".join(f"{c.key[:12]}: {c.status} ({'; '.join(c.reasons)})" for c in resolution.candidates[:3])
        raise NothingRunsHere(
            f"no artefact of {ref.model} can run on {machine.description}"
            + (f": {why}" if why else f": none is published in {store.location}"),
            resolution=resolution, where=str(ref),
            hint=f"`enginesmith resolve {ref.model}` lists every candidate; name one with MODEL@KEY, "
                 "or use --target / --allow-same-sm",
        )
    chosen_key = resolution.chosen.key
    manifest = next(m for m in listing.manifests if m.key == chosen_key)
    return Choice(manifest=manifest, candidate=resolution.chosen)
