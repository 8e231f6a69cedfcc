"""Moving refs (``latest``, ``stable``, …) with compare-and-swap."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from registry.catalog import load_manifest
from registry.errors import IntegrityError, NotFoundError, RegistryUnavailableError
from registry.manifest import Manifest
from registry.names import check_name
from registry.store import RefState, RegistryStore

CAS_ATTEMPTS = 20


class RefChange(BaseModel):
    model: str
    channel: str
    key: str
    previous: str | None
    moved: bool


def promote(store: RegistryStore, manifest: Manifest, channel: str) -> RefChange:
    """Point ``model:channel`` at ``manifest``, whatever it pointed at before."""
    check_name(channel, "channel")
    return _swap(store, manifest, channel, keep_current=lambda state: state.key == manifest.key)


def advance_channel(store: RegistryStore, manifest: Manifest, channel: str) -> RefChange:
    """Point ``model:channel`` at ``manifest`` unless it already points at one published at the same time or later.

    Publishing uses this, so concurrent or repeated publishes leave ``latest`` on the newest artefact.
    """
    check_name(channel, "channel")

    def keep_current(state: RefState) -> bool:
        if state.key == manifest.key:
            return True
        try:
            current = load_manifest(store, manifest.model, state.key)
        except (NotFoundError, IntegrityError):
            return False
        return current.published_at >= manifest.published_at

    return _swap(store, manifest, channel, keep_current)


def _swap(
    store: RegistryStore, manifest: Manifest, channel: str, keep_current: Callable[[RefState], bool]
) -> RefChange:
    for _ in range(CAS_ATTEMPTS):
        state = store.read_ref(manifest.model, channel)
        previous = None if state is None else state.key
        if state is not None and keep_current(state):
            return RefChange(model=manifest.model, channel=channel, key=state.key, previous=previous, moved=False)
        if store.write_ref(manifest.model, channel, manifest.key, expected=state):
            return RefChange(model=manifest.model, channel=channel, key=manifest.key, previous=previous, moved=True)
    raise RegistryUnavailableError(f"{manifest.model}:{channel} kept changing under us ({CAS_ATTEMPTS} attempts)",
                                   where=store.location, hint="run the same command again")
