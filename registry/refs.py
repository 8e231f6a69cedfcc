"""Moving refs (``latest``, ``stable``, …) with compare-and-swap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pydantic import BaseModel

from enginesmith.core.errors import UserError
from registry.catalog import load_manifest
from registry.errors import IntegrityError, NotFoundError, RegistryUnavailableError
from registry.manifest import CLOCK_SKEW, Manifest
from registry.names import check_name
from registry.store import RefState, RegistryStore

if TYPE_CHECKING:
    from registry.channel_statements import ChannelSigner

CAS_ATTEMPTS = 20


class RefChange(BaseModel):
    model: str
    channel: str
    key: str
    previous: str | None
    moved: bool
    statement: int | None = None  # the sequence of the statement signed for this move (or to keep it current)
    future_dated: str | None = None  # the key the channel was on, published in the future: not believed
    # Not moved though it would have been: no signing key was given and the channel has signed statements (this is
    # the newest's sequence), so a move would leave it vouched for nowhere. ``held`` says so, naming the command
    # that moves it (publish; promote refuses instead).
    unsigned_hold: int | None = None
    held: str = ""


def promote(store: RegistryStore, manifest: Manifest, channel: str, *, signer: ChannelSigner | None = None
            ) -> RefChange:
    """Point ``model:channel`` at ``manifest``, whatever it pointed at before. With ``signer``, the channel's next
    statement is signed first (also when it is on ``manifest`` already: that renews it); raises ``ChannelRaceError``
    when another promote signed that sequence first. Without one, raises ``UnsignedMoveError`` (moving nothing) for
    a channel that has signed statements: the move would leave it vouched for nowhere."""
    check_name(channel, "channel")
    change = _swap(store, manifest, channel, keep_current=lambda state: state.key == manifest.key, signer=signer,
                   renew_kept=True)
    if change.unsigned_hold is not None:
        raise UnsignedMoveError(f"{manifest.model}:{channel} {_vouched(change.unsigned_hold)}", where="--sign-key",
                                hint=f"promote with the key that signs {channel}: {_signed_promote(manifest, channel)}")
    return change


def advance_channel(store: RegistryStore, manifest: Manifest, channel: str, *, signer: ChannelSigner | None = None,
                    now: datetime | None = None) -> RefChange:
    """Point ``model:channel`` at ``manifest`` unless it already points at one published at the same time or later
    (and not in the future). With ``signer``, the move is signed, and a kept channel's statement kept current.
    Without one, a channel that has signed statements is held where it is (``RefChange.held`` says so and names the
    ``promote --sign-key`` command that moves it): an artefact that validated is still published, and the channel
    stays on what its promoters vouched for.

    Publishing uses this, so concurrent or repeated publishes leave ``latest`` on the newest artefact.
    """
    check_name(channel, "channel")
    latest_believable = (now or datetime.now(timezone.utc)) + CLOCK_SKEW  # as registry.manifest.believable_time
    future_dated: list[str] = []

    def keep_current(state: RefState) -> bool:
        if state.key == manifest.key:
            return True
        try:
            current = load_manifest(store, manifest.model, state.key)
        except (NotFoundError, IntegrityError):
            return False
        if current.published_at > latest_believable:
            future_dated.append(state.key)
            return False
        return current.published_at >= manifest.published_at

    change = _swap(store, manifest, channel, keep_current, signer=signer, renew_kept=False)
    held = "" if change.unsigned_hold is None else (
        f"{manifest.model}:{channel} not moved to {manifest.key[:12]}: it {_vouched(change.unsigned_hold)}; to move "
        f"it: {_signed_promote(manifest, channel, store.location)}")
    return change.model_copy(update={"future_dated": future_dated[-1] if future_dated else None, "held": held})


def _swap(store: RegistryStore, manifest: Manifest, channel: str, keep_current: Callable[[RefState], bool], *,
          signer: ChannelSigner | None = None, renew_kept: bool = False) -> RefChange:
    # Signed before the pointer moves, so a pull never meets a pointer newer than its statement; a swap that loses
    # to another writer signs again before its next try (sequences only grow), so the last to move signed last.
    model = manifest.model
    for _ in range(CAS_ATTEMPTS):
        state = store.read_ref(model, channel)
        previous = None if state is None else state.key
        if state is not None and keep_current(state):
            renewed = None
            if signer is not None:
                renewed = signer.sign(model, channel, state.key) if renew_kept else signer.settle(model, channel,
                                                                                                   state.key)
                if renewed is None and renew_kept:
                    raise _race(store, model, channel)
                # Written back unchanged, compare-and-swap: a writer whose statement is older than this one and
                # whose move was still to land now fails its own swap and signs again, instead of leaving the
                # pointer on its key under this statement.
                if renewed is not None and not store.write_ref(model, channel, state.key, expected=state):
                    continue
            return RefChange(model=model, channel=channel, key=state.key, previous=previous, moved=False,
                             statement=renewed.sequence if renewed else None)
        if signer is None and (newest := _newest_statement(store, model, channel)) is not None:
            return RefChange(model=model, channel=channel, key=previous or manifest.key, previous=previous,
                             moved=False, unsigned_hold=newest)
        claim = None
        if signer is not None:
            claim = signer.sign(model, channel, manifest.key)
            if claim is None:
                if renew_kept:  # promote: two racing, one wins and the other says so
                    raise _race(store, model, channel)
                continue
        if store.write_ref(model, channel, manifest.key, expected=state):
            return RefChange(model=model, channel=channel, key=manifest.key, previous=previous, moved=True,
                             statement=claim.sequence if claim else None)
    raise RegistryUnavailableError(f"{manifest.model}:{channel} kept changing under us ({CAS_ATTEMPTS} attempts)",
                                   where=store.location, hint="run the same command again")


class UnsignedMoveError(UserError):
    """A promote without a signing key onto a channel that has signed statements."""


def _newest_statement(store: RegistryStore, model: str, channel: str) -> int | None:
    """The sequence of ``model:channel``'s newest signed statement (None: nobody vouches for it, so it moves
    unsigned as it always did)."""
    from registry.channel_statements import statement_sequences

    sequences = statement_sequences(store, model, channel)
    return sequences[-1] if sequences else None


def _vouched(newest: int) -> str:
    return (f"is vouched for by signed statements (the newest is {newest}), and no signing key was given: moved "
            "unsigned, every --trust pull of it would be refused")


def _signed_promote(manifest: Manifest, channel: str, registry: str | None = None) -> str:
    where = f" --registry {registry}" if registry is not None else ""
    return f"enginesmith promote {manifest.ref} --channel {channel} --sign-key KEY{where} (or --sign-key-env NAME)"


def _race(store: RegistryStore, model: str, channel: str) -> Exception:
    from registry.channel_statements import ChannelRaceError

    return ChannelRaceError(f"another promote of {model}:{channel} signed the channel's next statement at the same "
                            "moment; this one moved nothing", where=store.location,
                            hint=f"see where it is now (enginesmith ls {model}) and promote again if still wanted")
