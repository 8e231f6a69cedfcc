"""Which artefact a command takes: the one a reference names, or the resolver's choice for this machine."""

from __future__ import annotations

from pydantic import BaseModel

from registry.catalog import UnreadableManifest, find_manifest, list_model
from registry.errors import NotFoundError, SignatureError, WithdrawnError
from registry.manifest import Manifest
from registry.names import Ref
from registry.resolve import Candidate, Constraints, Machine, Resolution, assess, resolve
from registry.signing import Trust
from registry.store import RegistryStore


class ModelResolution(BaseModel):
    resolution: Resolution
    unreadable: list[UnreadableManifest]  # manifests that could not be assessed (and why)
    ignored_withdrawals: list[str] = []  # withdrawals that do not count under the trust list, and why
    not_chosen: str | None = None  # with candidates and none chosen: why, in one sentence (nothing_chosen_summary)


class NothingRunsHere(NotFoundError):
    """A bare model with no artefact eligible on the machine; ``resolution`` says why each one lost, ``summary`` in
    one sentence."""

    def __init__(self, message: str, *, resolution: Resolution, summary: str, where: str, hint: str) -> None:
        super().__init__(message, where=where, hint=hint)
        self.resolution = resolution
        self.summary = summary


# Why candidates of a status were not chosen, as the summary counts them.
_NOT_CHOSEN_BECAUSE = {"untrusted": "refused by --trust", "withdrawn": "withdrawn",
                       "incompatible": "incompatible", "low-memory": "too big for the memory here",
                       "misses-slo": "missing the SLO", "same-sm-not-tuned": "built for another SKU of this SM"}


def nothing_chosen_summary(resolution: Resolution, unsigned: int) -> str:
    """Why no artefact of the model was chosen, by what stopped each (``unsigned``: how many of the untrusted ones
    carry no signature at all): the trust list or a withdrawal is named as such, not read as "does not run here"."""
    model, machine = resolution.model, resolution.machine.description
    counts: dict[str, int] = {}
    for candidate in resolution.candidates:
        counts[candidate.status] = counts.get(candidate.status, 0) + 1
    total = len(resolution.candidates)
    if counts.keys() == {"untrusted"}:
        if unsigned == total:
            return f"no artefact of {model} is signed ({total} published), and --trust takes only signed ones"
        refused = [f"{unsigned} not signed"] * bool(unsigned) + \
            [f"{total - unsigned} signed by a key it does not list, or not holding"] * bool(total - unsigned)
        return f"--trust refuses every artefact of {model}: {', '.join(refused)}"
    if not counts.keys() & {"untrusted", "withdrawn"}:
        return f"no artefact of {model} runs on {machine}"
    reasons = ", ".join(f"{count} {_NOT_CHOSEN_BECAUSE.get(status, status)}" for status, count in sorted(
        counts.items(), key=lambda item: -item[1]))
    return f"no artefact of {model} can be pulled on {machine}: {reasons}"


class PassedOver(BaseModel):
    """An artefact the resolver would have chosen but for its signature: who would have won, and why it lost."""

    key: str
    reason: str


class FallbackRefused(SignatureError):
    """A bare ``--trust`` pull whose best artefact's signature does not hold: taking the next one would hide that."""


class Choice(BaseModel):
    manifest: Manifest
    candidate: Candidate  # its status on the machine: a named artefact may be pulled even when not runnable
    passed_over: PassedOver | None = None  # with trust and allow_fallback: the better artefact that failed its check
    ignored_withdrawals: list[str] = []


def resolve_model(store: RegistryStore, model: str, machine: Machine, constraints: Constraints,
                  trust: Trust | None = None) -> ModelResolution:
    """Every published artefact of ``model`` assessed on ``machine``, best first; with ``trust``, each signature
    checked (an artefact whose signature does not hold is ``untrusted``)."""
    from registry.withdrawals import read_withdrawals

    listing = list_model(store, model, with_channels=False)
    signers, untrusted = check_signatures(store, listing.manifests, trust)
    withdrawals = read_withdrawals(store, model, trust, remember=True)
    resolution = resolve(model, listing.manifests, machine, constraints, signers=signers, untrusted=untrusted,
                         withdrawn=withdrawals.reasons())
    not_chosen = None
    if resolution.chosen is None and resolution.candidates:
        not_chosen = nothing_chosen_summary(resolution, _unsigned(listing.manifests, untrusted))
    return ModelResolution(resolution=resolution, unreadable=listing.unreadable,
                           ignored_withdrawals=withdrawals.ignored, not_chosen=not_chosen)


def _unsigned(manifests: list[Manifest], untrusted: dict[str, str]) -> int:
    """How many of the artefacts the trust list refused carry no signature at all."""
    return sum(m.signature is None for m in manifests if m.key in untrusted)


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
           trust: Trust | None = None, *, allow_fallback: bool = False, allow_withdrawn: bool = False) -> Choice:
    """The manifest ``ref`` names (``MODEL@KEY``, ``MODEL:CHANNEL``), or for a bare ``MODEL`` the best runnable one
    (with ``trust``: among those whose signature holds; a named one is checked when it is pulled).

    Raises ``NothingRunsHere`` when a bare model has nothing that can run on ``machine``, with the reasons, and
    ``FallbackRefused`` when the one it would choose but for its signature is not the one chosen (unless
    ``allow_fallback``: then ``Choice.passed_over`` names it). A withdrawn artefact is never chosen, and one named
    raises ``WithdrawnError`` (by key, unless ``allow_withdrawn``; through a channel, always).
    """
    from registry.withdrawals import read_withdrawals

    withdrawals = read_withdrawals(store, ref.model, trust, remember=True)
    if ref.channel is not None:
        withdrawals = withdrawals.through(ref.channel, trust)
    withdrawn = withdrawals.reasons()
    if ref.names_one_manifest:
        manifest = find_manifest(store, ref)
        if manifest.key in withdrawn and (ref.channel is not None or not allow_withdrawn):
            through = f" (through {ref.model}:{ref.channel})" if ref.channel else ""
            raise WithdrawnError(f"{manifest.ref}{through} is {withdrawn[manifest.key]}", where=store.location,
                                 hint="pull another build" + (f", or name this one as {manifest.ref} with "
                                                              "--allow-withdrawn" if ref.channel else
                                                              ", or add --allow-withdrawn to pull it anyway"))
        return Choice(manifest=manifest, candidate=assess(manifest, machine, constraints),
                      ignored_withdrawals=withdrawals.ignored)
    listing = list_model(store, ref.model, with_channels=False)
    signers, untrusted = check_signatures(store, listing.manifests, trust)
    resolution = resolve(ref.model, listing.manifests, machine, constraints, signers=signers, untrusted=untrusted,
                         withdrawn=withdrawn)
    if resolution.chosen is None:
        why = "; ".join(f"{c.key[:12]}: {c.status} ({'; '.join(c.reasons)})" for c in resolution.candidates[:3])
        unsigned = _unsigned(listing.manifests, untrusted)
        raise NothingRunsHere(
            f"no artefact of {ref.model} can run on {machine.description}"
            + (f": {why}" if why else f": none is published in {store.location}"),
            resolution=resolution, summary=nothing_chosen_summary(resolution, unsigned), where=str(ref),
            hint=f"`enginesmith resolve {ref.model}` lists every candidate; name one with MODEL@KEY, "
                 "or use --target / --allow-same-sm",
        )
    chosen_key = resolution.chosen.key
    manifest = next(m for m in listing.manifests if m.key == chosen_key)
    passed_over = None
    best_unchecked = resolve(ref.model, listing.manifests, machine, constraints, withdrawn=withdrawn).chosen \
        if untrusted else None  # ranked again without the signatures only where one failed
    if best_unchecked is not None and best_unchecked.key in untrusted:
        passed_over = PassedOver(key=best_unchecked.key, reason=untrusted[best_unchecked.key])
        if not allow_fallback:
            raise FallbackRefused(
                f"the artefact the resolver ranks first, {ref.model}@{best_unchecked.key[:12]}, fails its signature "
                f"check ({passed_over.reason}); the next one, {chosen_key[:12]}, was not taken in its place",
                where=f"{store.location}: {ref.model}",
                hint="tell whoever publishes this model (the registry may have been tampered with); "
                     "--allow-fallback takes the best trusted one and says which it passed over")
    return Choice(manifest=manifest, candidate=resolution.chosen, passed_over=passed_over,
                  ignored_withdrawals=withdrawals.ignored)
