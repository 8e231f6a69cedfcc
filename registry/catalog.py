"""Reading a registry: load and list manifests, and find the one a reference names."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel

from enginesmith.core.errors import UserError
from registry.errors import ForeignRecordError, IntegrityError, NotFoundError
from registry.manifest import Manifest, key_problem, parse_manifest
from registry.names import Ref, manifest_path
from registry.store import RegistryStore

# Reading manifests from object storage is latency-bound: a few at a time.
READ_THREADS = 8


class UnreadableManifest(BaseModel):
    model: str
    key: str
    problem: str


class ModelListing(BaseModel):
    """Everything published for one model: readable manifests (newest first), the ones that are not, channels."""

    model: str
    manifests: list[Manifest]
    unreadable: list[UnreadableManifest]
    channels: dict[str, str]  # channel → manifest key
    foreign: list[UnreadableManifest] = []  # records another tool wrote where ours live (an OCI tag): not ours


class ModelSummary(BaseModel):
    model: str
    artefacts: int  # ours, readable or not
    channels: dict[str, str]
    foreign: int = 0  # records another tool wrote there, not counted as artefacts


def load_manifest(store: RegistryStore, model: str, key: str) -> Manifest:
    """The manifest ``model@key``; raises ``NotFoundError`` if absent, ``IntegrityError``/``UnsafePathError``
    if it cannot be trusted."""
    where = f"{store.location}/{manifest_path(model, key)}"
    body = store.read_manifest(model, key)
    if body is None:
        raise NotFoundError(f"no artefact {model}@{key}", where=store.location,
                            hint=f"`enginesmith ls {model}` lists what is published")
    manifest = parse_manifest(body, where)
    if manifest.model != model or manifest.key != key:
        raise IntegrityError(f"the manifest says it is {manifest.ref}, but it is stored as {model}@{key}",
                             where=where, hint="re-publish the artefact; do not copy manifests by hand")
    problem = key_problem(key, manifest.artefact, manifest.validation, stored=True)
    if problem:
        raise IntegrityError(f"the manifest is damaged: {problem}", where=where,
                             hint="re-publish the artefact; do not edit manifests by hand")
    return manifest


def list_model(store: RegistryStore, model: str, *, with_channels: bool = True) -> ModelListing:
    """Every manifest of ``model`` (and its channels, unless not wanted); a manifest that fails to load is
    listed with its problem, not raised."""
    keys = store.list_manifest_keys(model)

    def load(key: str) -> Manifest | tuple[bool, UnreadableManifest]:
        try:
            return load_manifest(store, model, key)
        except ForeignRecordError as exc:
            return True, UnreadableManifest(model=model, key=key, problem=exc.render())
        except (IntegrityError, NotFoundError) as exc:
            return False, UnreadableManifest(model=model, key=key, problem=exc.render())

    with ThreadPoolExecutor(READ_THREADS) as pool:
        loaded = list(pool.map(load, keys))
    manifests = sorted((m for m in loaded if isinstance(m, Manifest)), key=lambda m: m.published_at, reverse=True)
    channels = channel_keys(store, model) if with_channels else {}
    failed = [m for m in loaded if not isinstance(m, Manifest)]
    return ModelListing(model=model, manifests=manifests, unreadable=[m for foreign, m in failed if not foreign],
                        foreign=[m for foreign, m in failed if foreign], channels=channels)


def list_models(store: RegistryStore) -> list[ModelSummary]:
    """Each model with its artefacts counted; on a store where another tool may write beside us (OCI), every
    manifest is read, so a foreign record is not counted as an artefact."""
    summaries = []
    for model in store.list_models():
        channels = channel_keys(store, model)
        if store.shares_namespace:
            listing = list_model(store, model, with_channels=False)
            artefacts, foreign = len(listing.manifests) + len(listing.unreadable), len(listing.foreign)
        else:
            artefacts, foreign = len(store.list_manifest_keys(model)), 0
        if artefacts or channels:  # gc may leave an empty directory behind
            summaries.append(ModelSummary(model=model, artefacts=artefacts, channels=channels, foreign=foreign))
    return summaries


def find_manifest(store: RegistryStore, ref: Ref) -> Manifest:
    """The manifest that ``MODEL@KEY`` (a key or unique prefix) or ``MODEL:CHANNEL`` names.

    Raises ``NotFoundError`` when nothing matches and ``UserError`` when a key prefix is ambiguous.
    """
    if ref.channel is not None:
        state = store.read_ref(ref.model, ref.channel)
        if state is None:
            known = ", ".join(store.list_channels(ref.model)) or "none"
            raise NotFoundError(f"{ref} does not exist", where=store.location,
                                hint=f"channels of {ref.model}: {known}; "
                                     "`enginesmith promote REF --channel NAME` makes one")
        return load_manifest(store, ref.model, state.key)
    if ref.key is None:
        raise UserError(f"{ref} names a model, not one artefact", where="REF",
                        hint="add @KEY or :CHANNEL, or use `enginesmith resolve` to choose")
    keys = store.list_manifest_keys(ref.model)
    if ref.key in keys:
        return load_manifest(store, ref.model, ref.key)
    matches = [k for k in keys if k.startswith(ref.key)]
    if not matches:
        raise NotFoundError(f"no artefact {ref}", where=store.location,
                            hint=f"`enginesmith ls {ref.model}` lists what is published")
    if len(matches) > 1:
        raise UserError(f"key prefix {ref.key!r} matches {len(matches)} artefacts: {', '.join(matches[:5])}",
                        where="REF", hint="give more characters of the key")
    return load_manifest(store, ref.model, matches[0])


def channel_keys(store: RegistryStore, model: str) -> dict[str, str]:
    """Channel → the key it points at, as the registry holds them now."""
    channels = {}
    for channel in store.list_channels(model):
        state = store.read_ref(model, channel)
        if state is not None:
            channels[channel] = state.key
    return channels
