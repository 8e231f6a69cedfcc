"""The registry verbs of the ``enginesmith`` command: publish, ls, show, resolve, pull, promote, history, gc, bundle.

Each calls into ``registry/`` and prints a rich table for people or JSON (``--json``) for scripts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.text import Text

from enginesmith.cli.views import print_notes, print_support, print_validation
from enginesmith.core.console import Cell, print_json, stderr, stdout, styled, table
from enginesmith.core.diskspace import size_label
from enginesmith.core.errors import UserError
from enginesmith.core.extras import EXTRA_HINT
from enginesmith.core.state import DEFAULTS, REGISTRY_ENV

if TYPE_CHECKING:  # imported where used, so that `enginesmith --help` stays quick
    from datetime import timedelta

    from rich.progress import Progress, TaskID

    from registry.channel_statements import ChannelStatementError
    from registry.history import BuildEntry, CellHistory, ModelHistory
    from registry.manifest import Manifest
    from registry.pull import ChosenProfile
    from registry.resolve import Candidate, Constraints, Machine, Resolution
    from registry.signing import SigningKey, Trust
    from registry.store import RegistryStore
    from registry.transfer import RateLimiter

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
RegistryOption = Annotated[str, typer.Option(
    "--registry", envvar="ENGINESMITH_REGISTRY", show_default=True,
    help="The registry: a local directory, s3://bucket/prefix, or oci://host[:port]/namespace.",
)]
S3EndpointOption = Annotated[str | None, typer.Option(
    "--s3-endpoint", envvar="AWS_ENDPOINT_URL", help="S3-compatible endpoint URL (default: AWS).",
)]
JobsOption = Annotated[int, typer.Option("--jobs", min=1, max=64, help="Files transferred at the same time.")]
LimitRateOption = Annotated[str | None, typer.Option(
    "--limit-rate", help="Cap the transfer at this many bytes per second, e.g. 50M.",
)]
TargetOption = Annotated[str, typer.Option(
    "--target", help="auto (the GPUs detected here; cpu when there are none), cpu, or a catalogue SKU.",
)]
RecipeOption = Annotated[str | None, typer.Option("--recipe", help="Only artefacts of this recipe.")]
TpOption = Annotated[int | None, typer.Option("--tp", min=1, help="Only artefacts with this tensor parallelism.")]
AllowSameSmOption = Annotated[bool, typer.Option(
    "--allow-same-sm", help="Accept an artefact built for another SKU with the same SM (not tuned for this one).",
)]
ObjectiveOption = Annotated[str, typer.Option(
    "--objective", help="Rank by the validation report's throughput or latency.",
)]
SloOption = Annotated[str | None, typer.Option(
    "--slo", help="Latency bounds a serving profile must meet, e.g. 'ttft_p95<=500ms,tpot_p95<=40ms' (ttft, tpot, "
                  "e2el; p50, p90, p95, p99; ms or s): the profile with the most goodput that meets them is chosen.",
)]
ConcurrencyOption = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="With --slo: judge the profiles at this many requests in flight only.",
)]
SignKeyOption = Annotated[Path | None, typer.Option(
    "--sign-key", help="Sign with this elliptic-curve private key (PEM, mode 600).")]
SignKeyEnvOption = Annotated[str | None, typer.Option(
    "--sign-key-env", help="Sign with the PEM private key held in this environment variable.")]
PassphraseEnvOption = Annotated[str | None, typer.Option(
    "--passphrase-env", help="The environment variable holding the signing key's passphrase.")]
TrustOption = Annotated[list[str] | None, typer.Option(
    "--trust", envvar="ENGINESMITH_TRUST", help="Accept only artefacts signed by these keys: a PEM public key, a "
    "directory of them, or a trust YAML (keys: {name: path}, channels: {prod: {signers: [name], expires: 7d}}, "
    "revoked: {name: time}); repeatable.",
)]
RuntimeVersionOption = Annotated[str | None, typer.Option(
    "--runtime-version", help="The TensorRT-LLM version the engine will run on (default: the installed one).",
)]

DEFAULT_REGISTRY = DEFAULTS[REGISTRY_ENV]


def add_registry_commands(app: typer.Typer) -> None:
    """Register the registry verbs on ``app``."""
    app.command("publish")(publish)
    app.command("ls")(list_artefacts)
    app.command("show")(show)
    app.command("resolve")(resolve)
    app.command("pull")(pull)
    app.command("promote")(promote)
    app.command("withdraw")(withdraw)
    app.command("history")(history)
    app.command("gc")(gc)
    app.command("bundle")(bundle)
    app.command("copy")(copy)
    app.command("catalogue")(catalogue)
    app.command("report")(report)
    app.command("support")(support)


def publish(
    artefact_dir: Annotated[Path, typer.Argument(help="An artefact directory (with artefact.json) from the build.")],
    key: Annotated[str | None, typer.Option("--key", help="Publish under this key (default: the artefact's).")] = None,
    validation: Annotated[Path | None, typer.Option(
        "--validation", help="The validation report (JSON) to keep in the manifest.")] = None,
    channel: Annotated[list[str] | None, typer.Option(
        "--channel", help="Channels to move to this artefact if it is newer (repeatable; default: latest).")] = None,
    sign_key: SignKeyOption = None,
    sign_key_env: SignKeyEnvOption = None,
    passphrase_env: PassphraseEnvOption = None,
    signature: Annotated[Path | None, typer.Option(
        "--signature", help="Keep this model-signing bundle, made over the directory before publishing.")] = None,
    jobs: JobsOption = 4,
    limit_rate: LimitRateOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Publish an artefact: upload the blobs the registry lacks, then the manifest, then move its channels. With a
    signing key, the manifest names an OpenSSF model-signing bundle over what a pull lays out."""
    from registry.publish import DEFAULT_CHANNELS, publish_artefact

    store = _open_store(registry, s3_endpoint, must_exist=False)
    report = _read_json_file(validation, "--validation") if validation else None
    limiter = _limiter(limit_rate)
    signing_key = _signing_key(sign_key, sign_key_env, passphrase_env)
    with _transfer_progress(enabled=not json_output, verb="uploading") as progress:
        result = publish_artefact(store, artefact_dir, key=key, validation=report,
                                  channels=channel or list(DEFAULT_CHANNELS), jobs=jobs, limiter=limiter,
                                  progress=progress, signing_key=signing_key, signature=signature)
    if json_output:
        print_json(result)
        return
    if result.created:
        stdout.print(f"published [bold]{escape(result.model)}@{result.key[:12]}[/] to {escape(result.registry)}: "
                     f"{result.files} files, {size_label(result.total_bytes)}; uploaded {result.uploaded_blobs} blobs "
                     f"({size_label(result.uploaded_bytes)}), {result.reused_blobs} already there", markup=True)
    else:
        stdout.print(f"{result.model}@{result.key[:12]} is already published in {result.registry}: nothing uploaded")
    if result.signer is not None:
        stdout.print(f"  signed by key {result.signer[:16]} ({result.signature_covers})")
    elif signing_key is not None or signature is not None:
        stderr.print(f"[yellow]note:[/] {escape(result.model)}@{result.key[:12]} was published unsigned before, and "
                     "a manifest does not change: it stays unsigned (rebuild to publish a new key signed)", markup=True)
    for change in result.channels:
        if change.moved:
            stdout.print(f"  {change.model}:{change.channel} → {change.key[:12]}")
        elif change.held:
            stderr.print(f"[yellow]note:[/] {escape(change.held)}", markup=True)
        else:
            stdout.print(f"  {change.model}:{change.channel} stays on {change.key[:12]} (as new or newer)")
    if result.unlisted_files:
        stderr.print(f"[yellow]note:[/] {len(result.unlisted_files)} file(s) not listed in artefact.json were not "
                     f"published: {escape(', '.join(result.unlisted_files[:5]))}", markup=True)


def list_artefacts(
    model: Annotated[str | None, typer.Argument(help="List this model's artefacts (default: list the models).")] = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """List the models in the registry, or one model's artefacts."""
    from registry.catalog import list_model, list_models
    from registry.names import check_name

    store = _open_store(registry, s3_endpoint)
    if model is None:
        summaries = list_models(store)
        if json_output:
            print_json(summaries)
            return
        stdout.print(table(f"Models in {store.location}", ["model", "artefacts", "channels"], [
            [s.model, str(s.artefacts) + (f" (and {s.foreign} not ours)" if s.foreign else ""),
             ", ".join(f"{c}→{k[:12]}" for c, k in sorted(s.channels.items())) or "-"]
            for s in summaries]))
        return
    listing = list_model(store, check_name(model, "MODEL"))
    if json_output:
        print_json(listing)
        return
    channels_of: dict[str, list[str]] = {}
    for channel, key in listing.channels.items():
        channels_of.setdefault(key, []).append(channel)
    rows: list[list[Cell]] = [
        [m.key[:12], m.artefact.kind, m.recipe, m.artefact.target, f"{m.artefact.tp}×{m.artefact.pp}",
         size_label(m.total_bytes), m.published[:19].replace("T", " "),
         ", ".join(sorted(channels_of.get(m.key, []))) or "-"]
        for m in listing.manifests
    ]
    rows += [[u.key[:12], "-", "-", "-", "-", "-", "-", Text.assemble(styled("unreadable", "red"), f": {u.problem}")]
             for u in listing.unreadable]
    rows += [[u.key[:12], "-", "-", "-", "-", "-", "-", Text.assemble(styled("not ours", "yellow"), f": {u.problem}")]
             for u in listing.foreign]
    stdout.print(table(f"{model} in {store.location}",
                       ["key", "kind", "recipe", "target", "tp×pp", "size", "published (UTC)", "channels"], rows))


def show(
    ref: Annotated[str, typer.Argument(help="MODEL@KEY (a key or unique prefix) or MODEL:CHANNEL.")],
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    trust: TrustOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show one artefact's manifest: lineage, target, versions, validation and files. Who signed it is what the
    manifest says until --trust checks the signature (and refuses one that does not hold); for MODEL:CHANNEL, --trust
    also checks the channel's signed statement and says who vouched for it until when."""
    from registry.catalog import find_manifest
    from registry.manifest import signer_label
    from registry.names import parse_ref
    from registry.signing import signature_covers_text, verify_stored

    trusted = _trust(trust)
    store = _open_store(registry, s3_endpoint)
    parsed = parse_ref(ref)
    manifest = find_manifest(store, parsed)
    signed_by = signer_label(manifest)
    vouched = None
    if trusted is not None:
        checked = verify_stored(store, manifest, trusted)
        signed_by = (f"{checked.signer} (key {checked.fingerprint[:16]}), checked against --trust; it covers "
                     f"{signature_covers_text(checked.covers)}")
        if parsed.channel is not None:
            from registry.channel_statements import ChannelStatementError, check_channel

            try:
                statement = check_channel(store, manifest.model, parsed.channel, manifest.key, trusted)
            except ChannelStatementError as refused:
                if not json_output:
                    _print_statement_checks(refused, f"{manifest.model}:{parsed.channel}")
                raise
            assert statement.claim is not None
            vouched = (f"statement {statement.claim.sequence}, signed by {statement.signer} at "
                       f"{statement.claim.issued.isoformat(timespec='seconds')}, good until "
                       f"{statement.claim.expires.isoformat(timespec='seconds')}")
    if json_output:
        print_json(manifest)
        return
    artefact, lineage = manifest.artefact, manifest.artefact.lineage
    rows = [
        ["key", manifest.key],
        ["kind", artefact.kind],
        ["target", f"{artefact.target} (SM {_sm(artefact.target_sm)}), tp {artefact.tp} × pp {artefact.pp}"],
        ["source", f"{lineage.repo_id} @ {lineage.commit_sha}"],
        ["recipe", lineage.recipe + (f" (calibration {lineage.calibration_dataset}, sha256 "
                                     f"{(lineage.calibration_sha256 or '-')[:16]})" if lineage.calibration_dataset
                                     else "")],
        ["versions", ", ".join(f"{k} {v}" for k, v in sorted(artefact.versions.items())) or "-"],
        ["built on", artefact.build_gpu.name if artefact.build_gpu else "-"],
        ["created / published", f"{artefact.created} / {manifest.published}"],
        ["validation", "none" if manifest.validation is None else ", ".join(sorted(manifest.validation))],
        ["signed by", signed_by],
    ]
    if vouched is not None:
        rows.append([f"{parsed.channel} vouched for by", vouched])
    stdout.print(table(manifest.ref, ["field", "value"], rows))
    files = [[f.path, f"{f.size:,}", (f.sha256 or "-")[:16]] for f in artefact.files]
    stdout.print(table(f"{len(files)} files, {size_label(manifest.total_bytes)}", ["path", "bytes", "sha256"], files))


def resolve(
    model: Annotated[str, typer.Argument(help="The model whose artefacts to rank.")],
    recipe: RecipeOption = None,
    target: TargetOption = "auto",
    tp: TpOption = None,
    allow_same_sm: AllowSameSmOption = False,
    objective: ObjectiveOption = "throughput",
    slo: SloOption = None,
    concurrency: ConcurrencyOption = None,
    runtime_version: RuntimeVersionOption = None,
    trust: TrustOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """List every artefact of a model with whether it runs here (and why not), and the one pull would choose.
    Exits 1 when none would be chosen (nothing here runs the model, or no profile meets --slo), so a job can gate
    on it.

    Example: enginesmith resolve smollm2-135m-instruct --slo 'ttft_p95<=500ms' --concurrency 4"""
    from registry.choose import resolve_model
    from registry.names import check_name

    store = _open_store(registry, s3_endpoint)
    machine, constraints = _machine_and_constraints(recipe, target, tp, allow_same_sm, objective, runtime_version,
                                                    slo, concurrency)
    result = resolve_model(store, check_name(model, "MODEL"), machine, constraints, _trust(trust))
    if json_output:
        print_json({**result.resolution.model_dump(mode="json"),
                    "unreadable": [u.model_dump() for u in result.unreadable]})
    else:
        _print_resolution(result.resolution, result.not_chosen)
        for unreadable in result.unreadable:
            stderr.print(f"[yellow]skipped[/] {escape(model)}@{unreadable.key[:12]}: {escape(unreadable.problem)}",
                         markup=True)
        for ignored in result.ignored_withdrawals:
            stderr.print(f"[yellow]ignored:[/] {escape(ignored)}", markup=True)
        if not result.resolution.candidates and not result.unreadable:
            stdout.print(f"No artefacts of {model} in {store.location}.")
    if result.resolution.chosen is None:
        raise typer.Exit(1)


def pull(
    what: Annotated[str, typer.Argument(
        metavar="MODEL|REF", help="A model (the resolver chooses), MODEL@KEY or MODEL:CHANNEL.")],
    dest: Annotated[Path | None, typer.Option(
        "--dest", help="Lay the files out here (default: <cache>/artefacts/<model>/<key>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be fetched; fetch nothing.")] = False,
    from_bundle: Annotated[Path | None, typer.Option(
        "--from-bundle", help="Pull from a bundle file instead of a registry (air-gapped).")] = None,
    recipe: RecipeOption = None,
    target: TargetOption = "auto",
    tp: TpOption = None,
    allow_same_sm: AllowSameSmOption = False,
    objective: ObjectiveOption = "throughput",
    slo: SloOption = None,
    concurrency: ConcurrencyOption = None,
    runtime_version: RuntimeVersionOption = None,
    trust: TrustOption = None,
    allow_fallback: Annotated[bool, typer.Option(
        "--allow-fallback", help="With --trust: when the best artefact's signature fails, take the best trusted one "
        "(and say which it passed over) instead of refusing.")] = False,
    allow_withdrawn: Annotated[bool, typer.Option(
        "--allow-withdrawn", help="Pull an artefact named by key even though it was withdrawn.")] = False,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", envvar="ENGINESMITH_CACHE_DIR", help="The blob cache shared by pulls.")] = None,
    jobs: JobsOption = 8,
    limit_rate: LimitRateOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Pull an artefact: fetch missing blobs (resuming, verified), lay the files out ready to serve. With --slo, the
    serving profile chosen is recorded beside the files, and `enginesmith serve` starts it with that profile's
    flags."""
    from registry.cache import BlobCache, default_cache_dir
    from registry.choose import NothingRunsHere, choose
    from registry.names import parse_ref
    from registry.pull import check_destination, check_free_space, check_pull_trust, plan_pull, pull_artefact
    from registry.signing import read_signature, signature_covers_text

    ref = parse_ref(what, where="MODEL|REF")
    limiter = _limiter(limit_rate)
    trusted = _trust(trust)
    machine, constraints = _machine_and_constraints(recipe, target, tp, allow_same_sm, objective, runtime_version,
                                                    slo, concurrency)
    if from_bundle is not None and not from_bundle.is_file():
        raise UserError(f"{from_bundle} does not exist" if not from_bundle.exists() else f"{from_bundle} is not a file",
                        where="--from-bundle", hint="give the file `enginesmith bundle REF… --out FILE` wrote")
    store = _open_store(str(from_bundle), s3_endpoint, given_as="--from-bundle") if from_bundle else \
        _open_store(registry, s3_endpoint)
    try:
        choice = choose(store, ref, machine, constraints, trusted, allow_fallback=allow_fallback,
                        allow_withdrawn=allow_withdrawn)
    except NothingRunsHere as nothing:
        if not nothing.resolution.candidates:
            raise  # nothing published: the error says so
        # As `resolve` does: every artefact with why it does not run here, then exit 1 having written nothing.
        if json_output:
            print_json(nothing.resolution)
        else:
            _print_resolution(nothing.resolution, None)  # the error line below says why
            within = f" within the SLO {constraints.slo}" if constraints.slo is not None else ""
            refused = any(c.status in ("untrusted", "withdrawn") for c in nothing.resolution.candidates)
            anyway = "" if refused else " (name one with MODEL@KEY to pull it anyway)"
            stderr.print(f"[bold red]error:[/] {escape(nothing.summary)}{escape(within)}; nothing was fetched or "
                         f"written{anyway}", markup=True)
        raise typer.Exit(1) from None
    manifest, candidate = choice.manifest, choice.candidate
    for ignored in choice.ignored_withdrawals if not json_output else []:
        stderr.print(f"[yellow]ignored:[/] {escape(ignored)}", markup=True)
    if choice.passed_over is not None:
        stderr.print(f"[yellow]warning:[/] passed over {escape(ref.model)}@{choice.passed_over.key[:12]}, which the "
                     f"resolver ranks first: {escape(choice.passed_over.reason)}", markup=True)
    for note in machine.notes if not json_output else []:
        stderr.print(f"[yellow]note:[/] {escape(note)}", markup=True)
    if not candidate.eligible and not json_output:
        stderr.print(f"[yellow]warning:[/] {escape(manifest.ref)} is {candidate.status} on "
                     f"{escape(machine.description)}: {escape('; '.join(candidate.reasons))}", markup=True)
    profile = _chosen_profile(manifest, candidate, constraints)
    from enginesmith.core.state import CACHE_ENV, writable_dir

    cache = BlobCache(writable_dir(cache_dir or default_cache_dir(), what="cache",
                                   variable="--cache-dir" if cache_dir else CACHE_ENV, create=False))
    destination = dest or cache.default_dest(manifest.model, manifest.key)
    plan = plan_pull(manifest, cache, destination, store.location)
    if not dry_run:
        check_destination(destination)
        check_free_space(plan, cache, destination)  # before the progress bar, which would say it had started
    checked_signature = None
    if trusted is not None:  # a refused artefact, too, is refused before the bar
        from registry.channel_statements import ChannelStatementError

        signature_body = read_signature(store, manifest)
        try:
            checked_signature = signature_body, check_pull_trust(store, manifest, signature_body, trusted,
                                                                 channel=ref.channel, profile=profile)
        except ChannelStatementError as refused:
            if not json_output:
                _print_statement_checks(refused, f"{manifest.model}:{ref.channel}")
            raise
    started = time.monotonic()
    with _transfer_progress(enabled=not (json_output or dry_run), verb="pulling",
                            total_bytes=plan.bytes_to_fetch) as progress:
        result = pull_artefact(store, manifest, dest=destination, cache=cache, jobs=jobs, limiter=limiter,
                               progress=progress, dry_run=dry_run, profile=profile, trust=trusted,
                               channel=ref.channel, checked_signature=checked_signature)
    if json_output:
        print_json(result)
        return
    if dry_run:
        rows = [[b.label, size_label(b.size), b.state,
                 size_label(b.size - b.partial_bytes if b.state != "cached" else 0)]
                for b in result.plan.blobs]
        stdout.print(table(f"Would pull {manifest.model}@{manifest.key[:12]} from {store.location} to {destination}",
                           ["file", "size", "in cache", "to fetch"], rows))
        stdout.print(f"would fetch {size_label(result.plan.bytes_to_fetch)} of {size_label(result.total_bytes)}")
        return
    elapsed = time.monotonic() - started
    stdout.print(f"pulled [bold]{escape(manifest.model)}@{manifest.key[:12]}[/] → {escape(str(result.dest))}: "
                 f"{result.files} files, {size_label(result.total_bytes)} in {elapsed:.1f} s (fetched "
                 f"{size_label(result.downloaded_bytes)}, resumed {size_label(result.resumed_bytes)}, cached "
                 f"{size_label(result.cached_bytes)})", markup=True)
    for label in result.refetched:
        stderr.print(f"[yellow]note:[/] {escape(label)} did not match its sha256 at first and was fetched again",
                     markup=True)
    if result.signature is not None:
        stdout.print(f"signed by [bold]{escape(result.signature.signer)}[/] (key {result.signature.fingerprint[:16]}), "
                     f"which --trust lists; the signature covers "
                     f"{escape(signature_covers_text(result.signature.covers))}", markup=True)
    if profile is not None:
        stdout.print(f"serving profile {profile.name} ({' '.join(profile.args) or 'as built'}): it meets "
                     f"{profile.slo} at c={profile.concurrency}; `enginesmith serve {result.dest}` starts it")


def promote(
    ref: Annotated[str, typer.Argument(help="MODEL@KEY or MODEL:CHANNEL to point the channel at.")],
    channel_argument: Annotated[str | None, typer.Argument(
        metavar="CHANNEL", help="The channel to move (the older spelling of --channel).", show_default=False)] = None,
    channel: Annotated[str | None, typer.Option("--channel", help="The channel to move, e.g. stable.")] = None,
    sign_key: SignKeyOption = None,
    sign_key_env: SignKeyEnvOption = None,
    passphrase_env: PassphraseEnvOption = None,
    expires: Annotated[str | None, typer.Option(
        "--expires", help="How long the signed statement stays good (default: the trust file's expires: for the "
        "channel, else 7d).")] = None,
    trust: TrustOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Point a channel (stable, canary, …) at an artefact, and record who moved it and when in the model's history.

    Example: enginesmith promote tiny-llama@3f2a9c --channel stable

    The move is recorded as made by ENGINESMITH_ACTOR, else user@host. With --trust, the artefact's signature must
    hold, and where the trust file lists who may move the channel (channels: {prod: [nightly]}), be by one of them.
    With --sign-key, the channel's next statement (an in-toto statement in DSSE: the model, channel, artefact,
    sequence and expiry) is signed before the channel moves; promoting to where it is renews that statement.
    """
    from registry.catalog import find_manifest
    from registry.history import ChannelMove, current_actor, now, record_channel_move
    from registry.names import parse_ref
    from registry.refs import promote as promote_ref

    if (channel is None) == (channel_argument is None):
        raise UserError("give the channel to move once" if channel else "no channel given", where="--channel",
                        hint="write `enginesmith promote REF --channel NAME`, e.g. --channel stable")
    name = channel if channel is not None else channel_argument
    assert name is not None
    store = _open_store(registry, s3_endpoint)
    manifest = find_manifest(store, parse_ref(ref))
    trusted = _trust(trust)
    if trusted is not None:
        from registry.signing import authorize_channel

        authorize_channel(store, manifest, name, trusted)
    signing_key = _signing_key(sign_key, sign_key_env, passphrase_env)
    signer = None
    if signing_key is not None:
        from registry.channel_statements import ChannelSigner

        signer = ChannelSigner(store, signing_key, _statement_validity(expires, name, trusted))
    elif expires is not None:
        raise UserError("--expires is the signed statement's, and no signing key was given", where="--expires",
                        hint="add --sign-key KEY (or --sign-key-env NAME)")
    change = promote_ref(store, manifest, name, signer=signer)
    if change.moved:
        move = ChannelMove(model=change.model, channel=change.channel, key=change.key, previous=change.previous,
                           actor=current_actor(), recorded=now())
        try:
            record_channel_move(store, move)
        except UserError as exc:  # the channel has moved; say that the log lacks it rather than fail the move
            stderr.print(f"[yellow]warning:[/] {escape(change.model)}:{escape(change.channel)} moved, but the move "
                         f"was not recorded in its history: {escape(exc.render())}", markup=True)
    if json_output:
        print_json(change)
        return
    before = f" (was {change.previous[:12]})" if change.previous else " (new channel)"
    verb = "→" if change.moved else "already on"
    signed = f"; signed statement {change.statement}" if change.statement is not None else ""
    stdout.print(f"{change.model}:{change.channel} {verb} {change.key[:12]}{before if change.moved else ''}{signed}")


def _statement_validity(expires: str | None, channel: str, trusted: Trust | None) -> timedelta:
    from datetime import timedelta

    from registry.channel_statements import DEFAULT_VALID_FOR
    from registry.signing import statement_validity_s

    if expires is not None:
        return timedelta(seconds=statement_validity_s(expires, "--expires", "e.g. --expires 7d"))
    configured = trusted.channel_expiry_s.get(channel) if trusted is not None else None
    return timedelta(seconds=configured) if configured else DEFAULT_VALID_FOR


def _print_statement_checks(refused: ChannelStatementError, channel: str) -> None:
    """The table a refused channel prints: each check of its statement, in order, and which one failed."""
    from registry.statements import CHECKS

    claim, failed = refused.check.claim, refused.check.failed
    reached = True
    rows: list[list[Cell]] = []
    for name, what in CHECKS:
        if name == failed:
            rows.append([what, styled(f"FAILED: {refused.check.detail}", "red")])
            reached = False
        else:
            rows.append([what, styled("holds", "green") if reached else "not checked"])
    about = (f"statement {claim.sequence} ({claim.model}:{claim.channel} → {claim.key[:12]}, signed by "
             f"{refused.check.signer or 'no trusted key'})" if claim is not None else "no statement")
    stderr.print(table(f"{channel}: {about}", ["check", "result"], rows))
    for line in refused.skipped:
        stderr.print(f"[yellow]note:[/] read past {escape(line)}", markup=True)


def withdraw(
    ref: Annotated[str, typer.Argument(help="MODEL@KEY (or MODEL:CHANNEL, the build it is on): the build no node may "
                                            "pull any more.")],
    reason: Annotated[str, typer.Option("--reason", help="Why, as resolve and pull will say it.")],
    sign_key: SignKeyOption = None,
    sign_key_env: SignKeyEnvOption = None,
    passphrase_env: PassphraseEnvOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Withdraw a build: publish a signed withdrawal, after which resolve and pull never choose it (and say why),
    and pulling it by key needs --allow-withdrawn. Nothing is deleted.

    Example: enginesmith withdraw tiny-llama@3f2a9c --reason "wrong tokenizer" --sign-key keys/nightly.key
    """
    from registry.names import parse_ref
    from registry.withdrawals import withdraw as withdraw_build

    parsed = parse_ref(ref, where="MODEL@KEY")
    if not parsed.names_one_manifest:
        raise UserError(f"{ref!r} does not name one build", where="MODEL@KEY",
                        hint="withdraw a build by its key, e.g. tiny-llama@3f2a9c (enginesmith ls MODEL lists them), "
                             "or by the channel on it, e.g. tiny-llama:prod")
    if not reason.strip():
        raise UserError("a withdrawal needs its reason", where="--reason", hint='e.g. --reason "wrong tokenizer"')
    signing_key = _signing_key(sign_key, sign_key_env, passphrase_env)
    if signing_key is None:
        raise UserError("a withdrawal is signed, and no signing key was given", where="--sign-key",
                        hint="--sign-key KEY (or --sign-key-env NAME): a key the pulling nodes' trust file lists")
    store = _open_store(registry, s3_endpoint)
    from registry.catalog import find_manifest

    manifest = find_manifest(store, parsed)
    withdrawal = withdraw_build(store, manifest.model, manifest.key, reason.strip(), signing_key)
    if json_output:
        print_json(withdrawal)
        return
    stdout.print(f"withdrew {manifest.model}@{manifest.key[:12]} ({escape(withdrawal.reason)}), signed by key "
                 f"{signing_key.fingerprint[:16]}: resolve and pull will not choose it")


def history(
    model: Annotated[str, typer.Argument(help="The model whose cells' builds to show.")],
    recipe: Annotated[str | None, typer.Option("--recipe", help="Only cells of this recipe.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only cells of this target.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only cells of this kind, e.g. hf-quantized.")] = None,
    plots: Annotated[Path | None, typer.Option(
        "--plots", help="Also write one PNG per metric and cell into DIR/<cell>/.")] = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Each cell's builds across nightlies: what each measured, whether it passed, where the channels point, and
    what regressed beyond the measurements' spread.

    Example: enginesmith history tiny-llama --recipe int8-sq --plots history-plots
    """
    from registry.history import load_history
    from registry.names import check_name

    store = _open_store(registry, s3_endpoint)
    result = load_history(store, check_name(model, "MODEL"), recipe=recipe, target=target, kind=kind)
    written = _write_history_plots(result, plots) if plots is not None else []
    if json_output:
        print_json(result)
        return
    _print_history(result, store.location)
    if written:
        stdout.print(f"wrote {len(written)} plot(s) under {plots}")


def report(
    ref: Annotated[str, typer.Argument(help="MODEL@KEY or MODEL:CHANNEL in the registry.")],
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Print the validation report a published artefact carries in its manifest."""
    from enginesmith.core.reports import parse_report
    from registry.catalog import find_manifest
    from registry.names import parse_ref

    manifest = find_manifest(_open_store(registry, s3_endpoint), parse_ref(ref))
    parsed = parse_report(manifest.validation)
    if parsed is None:
        raise UserError(f"{ref} was published without a validation report", where=ref)
    if isinstance(parsed, str):
        raise UserError(f"{ref} carries a validation report this version cannot read: {parsed}", where=ref,
                        hint="re-validate the artefact, or use the enginesmith that published it")
    if json_output:
        print_json(parsed)
        return
    print_validation(parsed)


def support(
    config: Annotated[Path, typer.Argument(help="A build-matrix config whose cells to show.")],
    markdown: Annotated[Path | None, typer.Option(
        "--markdown", help="Also write the matrix as a Markdown table to this file.")] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", envvar="ENGINESMITH_REGISTRY",
        help="The registry whose history to read (default: the config's).")] = None,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """The support matrix of a config: each model × recipe × kind × target cell as validated (accuracy drop, greedy
    agreement with BF16, perplexity), gate-failed, failed (the stage's error), refused by the plan (its rule and
    reason) or not run, from the plan and the registry's history of the planned inputs.

    Example: enginesmith support configs/examples/tiny-cpu.yaml --markdown support.md
    """
    from enginesmith.core.config import default_catalogue, load_pipeline_config
    from pipeline.common.plan_sources import hub_revision_notes
    from pipeline.common.steps import registry_url
    from pipeline.support import config_support, support_cells
    from registry.support import markdown_table

    catalogue = default_catalogue()
    pipeline = load_pipeline_config(config, catalogue)
    # The config's own registry is made by its first night; before that the matrix is the plan's refusals and "not
    # run". A registry named here must be there.
    store = _open_store(registry or registry_url(pipeline), s3_endpoint, must_exist=registry is not None)
    cells = support_cells(pipeline, config.parent, catalogue)
    matrix = config_support(pipeline, config.parent, catalogue, store, cells=cells)
    if markdown is not None:
        markdown.write_text(markdown_table(matrix), encoding="utf-8")
    if json_output:
        print_json(matrix)
        return
    print_support(matrix)
    print_notes(hub_revision_notes(pipeline, cells))


def gc(
    keep_last: Annotated[int, typer.Option("--keep-last", min=1, help="Artefacts kept per cell (plus every one a "
                                           "channel points at).")] = 3,
    grace: Annotated[str, typer.Option("--grace", help="Keep unreferenced blobs younger than this (e.g. 1h, 30m, "
                                       "0): a publish may be uploading them.")] = "1h",
    stage_ttl: Annotated[str, typer.Option("--stage-ttl", help="Keep quantised checkpoints handed between nodes "
                                           "(quantize_on) this long after they were stashed (e.g. 7d, 12h).")] = "7d",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")] = False,
    trust: Annotated[list[str] | None, typer.Option(
        "--trust", envvar="ENGINESMITH_TRUST", help="Order builds only by publication times these keys signed (a PEM "
        "public key, a directory of them, or a trust YAML); repeatable.")] = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Delete old artefacts by the retention rule, then blobs no artefact or recent stage record references.

    Builds are ordered by the publication time their signature covers (with --trust: a trusted key's signature). A
    cell where one build's time is not signed and others' are is kept whole, and the build named: gc does not guess.
    """
    from registry.gc import collect_garbage, parse_duration

    store = _open_store(registry, s3_endpoint)
    try:
        grace_s = parse_duration(grace)
    except ValueError as exc:
        raise UserError(str(exc), where="--grace") from None
    try:
        stage_ttl_s = parse_duration(stage_ttl)
    except ValueError as exc:
        raise UserError(str(exc), where="--stage-ttl") from None
    result = collect_garbage(store, keep_last=keep_last, grace_s=grace_s, dry_run=dry_run, stage_ttl_s=stage_ttl_s,
                             trust=_trust(trust))
    if json_output:
        print_json(result)
        return
    verb = "would delete" if dry_run else "deleted"
    stdout.print(f"{store.location}: {verb} {len(result.deleted_manifests)} artefact(s) and {result.deleted_blobs} "
                 f"blob(s) ({size_label(result.deleted_bytes)}); kept {result.kept_manifests} artefact(s), "
                 f"{result.young_unreferenced_blobs} young unreferenced blob(s)")
    for ref in result.deleted_manifests:
        stdout.print(f"  {verb} {ref}")
    for record in result.deleted_stage_records:
        stdout.print(f"  {verb} stage record {record}")
    for foreign in result.skipped_foreign:
        stdout.print(f"  skipped {foreign}: not an enginesmith record (another tool's; gc leaves it alone)")
    for ref, why in result.unordered.items():
        stderr.print(f"[yellow]note:[/] kept every build of {escape(ref)}'s cell: {escape(why)}, so which builds are "
                     f"oldest is not known (delete or re-publish {escape(ref)} to let gc order the cell)", markup=True)


def bundle(
    refs: Annotated[list[str], typer.Argument(
        metavar="REFS...", help="MODEL@KEY, MODEL:CHANNEL, or MODEL (all of its artefacts).")],
    out: Annotated[Path, typer.Option("--out", help="The bundle file to write.")],
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write artefacts and their blobs into one file, to carry to an air-gapped site (`pull --from-bundle`)."""
    from registry.bundle import bundle_manifests, write_bundle

    store = _open_store(registry, s3_endpoint)
    manifests, channels = bundle_manifests(store, refs)
    with _transfer_progress(enabled=not json_output, verb="bundling",
                            total_bytes=sum(m.total_bytes for m in manifests)) as progress:
        result = write_bundle(store, manifests, out, refs=channels, progress=progress)
    if json_output:
        print_json(result)
        return
    stdout.print(f"wrote {out}: {len(result.artefacts)} artefact(s), {result.blobs} blobs, {size_label(result.bytes)}")


def copy(
    source: Annotated[str, typer.Argument(help="The registry to copy from (a directory, s3://, oci://, a bundle).")],
    destination: Annotated[str, typer.Argument(help="The registry to copy into.")],
    refs: Annotated[list[str] | None, typer.Argument(
        metavar="[REFS]...", help="MODEL@KEY, MODEL:CHANNEL, or MODEL (all of its artefacts); none: everything.")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", envvar="ENGINESMITH_CACHE_DIR", help="The blob cache the copy passes through.")] = None,
    jobs: JobsOption = 4,
    limit_rate: LimitRateOption = None,
    s3_endpoint: S3EndpointOption = None,
    json_output: JsonOption = False,
) -> None:
    """Copy artefacts between registries as they are: blobs once, manifests byte for byte, signatures, withdrawals
    and the history, then the channels. Run it again to continue one that was interrupted. Channel statements name
    their registry and are not copied: vouch for a channel in the destination with `promote --sign-key` there.

    Example: enginesmith copy s3://staging/registry s3://prod/registry tiny-llama:prod
    """
    from enginesmith.core.state import CACHE_ENV, writable_dir
    from registry.cache import BlobCache, default_cache_dir
    from registry.copy import copy_artefacts, copy_selection

    from_store = _open_store(source, s3_endpoint, given_as="SOURCE")
    to_store = _open_store(destination, s3_endpoint, given_as="DESTINATION", must_exist=False)
    if from_store.identity == to_store.identity:
        raise UserError("the source and the destination are the same registry", where="DESTINATION",
                        hint="copy into another registry")
    manifests, channels = copy_selection(from_store, refs or [])
    cache = BlobCache(writable_dir(cache_dir or default_cache_dir(), what="cache",
                                   variable="--cache-dir" if cache_dir else CACHE_ENV, create=False))
    result = copy_artefacts(from_store, to_store, manifests, channels, cache, jobs=jobs, limiter=_limiter(limit_rate))
    if json_output:
        print_json(result)
        return
    stdout.print(f"copied {len(result.artefacts)} artefact(s) to {to_store.location} ({len(result.present)} there "
                 f"already): {result.blobs_copied} blobs, {size_label(result.bytes_copied)}; "
                 f"{result.history_records} history records")
    for moved in result.channels:
        if moved.moved:
            stdout.print(f"  {moved.model}:{moved.channel} → {moved.key[:12]}")
            if moved.note:
                stderr.print(f"[yellow]note:[/] {escape(moved.model)}:{escape(moved.channel)}: {escape(moved.note)}",
                             markup=True)
        else:
            stderr.print(f"[yellow]note:[/] {escape(moved.model)}:{escape(moved.channel)} not moved: "
                         f"{escape(moved.why_not)}", markup=True)


def catalogue(
    out: Annotated[Path, typer.Option("--out", help="The directory to write the site to (replaced whole if an earlier "
                                      "catalogue is there).")],
    registry: RegistryOption = DEFAULT_REGISTRY,
    s3_endpoint: S3EndpointOption = None,
    trust: TrustOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write the registry as a static site (HTML, CSS, PNGs): every model, its artefacts, their reports and history.
    Each artefact's signing key is as its manifest names it, marked not checked; with --trust, the pages say whether
    each signature holds.

    The directory needs no server: open index.html, or copy it to a bucket, e.g.
    `enginesmith catalogue --out site --registry s3://models/registry && aws s3 sync site s3://models-site`.
    A registry may also be a bundle file (`enginesmith bundle`).
    """
    from importlib.util import find_spec

    from registry.site import write_catalogue

    if find_spec("matplotlib") is None:  # the reports are read without it; only their plots need it
        stderr.print("[yellow]note:[/] matplotlib is not installed: the pages have no plots "
                     f"({escape(EXTRA_HINT.format(extra='validation'))} for them)", markup=True)
    trusted = _trust(trust)
    store = _open_store(registry, s3_endpoint)
    # The pull commands on the pages must work from anywhere: a local registry is named by its absolute path.
    registry_url = registry if "://" in registry else str(Path(registry).absolute())
    result = write_catalogue(store, out, registry_url=registry_url, s3_endpoint=s3_endpoint, trust=trusted)
    if json_output:
        print_json(result)
        return
    stdout.print(f"wrote {result.pages} pages for {result.models} model(s), {result.artefacts} artefact(s) "
                 f"from {store.location}; open {result.index}")
    if result.unreadable:
        stderr.print(f"[yellow]note:[/] {result.unreadable} manifest(s) or history record(s) could not be read; "
                     "the pages list them with the reason", markup=True)


# --- helpers ------------------------------------------------------------------------------------------


def _chosen_profile(manifest: Manifest, candidate: Candidate, constraints: Constraints) -> ChosenProfile | None:
    """The serving profile the resolver chose for the SLO, as the pulled directory records it."""
    from enginesmith.core.reports import parse_report, serving_profiles_of
    from registry.pull import ChosenProfile

    choice = candidate.profile
    if constraints.slo is None or choice is None or not choice.meets or choice.concurrency is None:
        return None
    profile = next(p for p in serving_profiles_of(parse_report(manifest.validation)) if p.name == choice.profile)
    return ChosenProfile(name=profile.name, runtime=profile.runtime, args=profile.args, slo=str(constraints.slo),
                         concurrency=choice.concurrency, goodput=choice.goodput)


def _signing_key(key_file: Path | None, key_env: str | None, passphrase_env: str | None) -> SigningKey | None:
    if key_file is None and key_env is None:
        if passphrase_env is not None:
            raise UserError("--passphrase-env is the signing key's, and no key was given", where="--passphrase-env",
                            hint="add --sign-key FILE or --sign-key-env NAME")
        return None
    from registry.signing import load_signing_key

    return load_signing_key(key_file=key_file, key_env=key_env, passphrase_env=passphrase_env,
                            where="--sign-key" if key_file is not None else "--sign-key-env")


def _trust(paths: list[str] | None) -> Trust | None:
    """The trust list of ``--trust`` (or ``ENGINESMITH_TRUST``). Set but empty is an error, not "trust nothing":
    an empty variable would otherwise switch verification off, and an empty path would read the working directory."""
    if paths is None and os.environ.get("ENGINESMITH_TRUST") == "":
        raise UserError("ENGINESMITH_TRUST is set but empty", where="ENGINESMITH_TRUST",
                        hint="set it to the trusted keys (a PEM key, a directory of them, or a trust YAML), or unset "
                             "it to pull without verifying signatures")
    if not paths:
        return None
    if any(not text.strip() for text in paths):
        raise UserError("--trust is empty", where="--trust",
                        hint="give a PEM public key, a directory of them, or a trust YAML")
    from registry.signing import load_trust

    return load_trust([Path(text) for text in paths])


def _open_store(registry: str, s3_endpoint: str | None, *, given_as: str | None = None,
                must_exist: bool = True) -> RegistryStore:
    """The registry a command names (``given_as``: the option, argument or variable that named it, for messages;
    default ``--registry`` or ``ENGINESMITH_REGISTRY``). It must be there, but where the command creates it."""
    from registry.store import open_store

    return open_store(registry, s3_endpoint=s3_endpoint, must_exist=must_exist,
                      where=given_as or _given_as(registry, "--registry", REGISTRY_ENV))


def _given_as(value: str, flag: str, variable: str) -> str:
    """How the user gave ``value``: ``variable`` where it came from the environment, else ``flag``."""
    on_command_line = any(arg == flag or arg.startswith(f"{flag}=") for arg in sys.argv[1:])
    return variable if not on_command_line and os.environ.get(variable) == value else flag


def _machine_and_constraints(recipe: str | None, target: str, tp: int | None, allow_same_sm: bool, objective: str,
                             runtime_version: str | None, slo: str | None = None,
                             concurrency: int | None = None) -> tuple[Machine, Constraints]:
    from enginesmith.core.slo import parse_slo
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    if objective not in ("throughput", "latency"):
        raise UserError(f"unknown objective {objective!r}", where="--objective", hint="use throughput or latency")
    if concurrency is not None and slo is None:
        raise UserError("--concurrency says where to judge an SLO, and no --slo was given", where="--concurrency",
                        hint="add --slo, e.g. --slo 'ttft_p95<=500ms'")
    objective_value: Literal["throughput", "latency"] = "throughput" if objective == "throughput" else "latency"
    parsed_slo = parse_slo(slo) if slo is not None else None  # before detecting the machine: a typo fails fast
    machine = describe_machine(target, runtime_version=runtime_version)
    return machine, Constraints(recipe=recipe, tp=tp, allow_same_sm=allow_same_sm, objective=objective_value,
                                slo=parsed_slo, concurrency=concurrency)


def _print_resolution(resolution: Resolution, not_chosen: str | None) -> None:
    """The candidates' table, the machine's notes, and which was chosen or (``not_chosen``) why none was."""
    colour = {"runnable": "green", "same-sm-not-tuned": "yellow", "misses-slo": "yellow", "low-memory": "yellow",
              "incompatible": "red", "untrusted": "red", "withdrawn": "red"}
    slo = resolution.constraints.slo
    metric_name = "tok/s" if resolution.constraints.objective == "throughput" else "TPOT ms"
    rows: list[list[Cell]] = []
    for candidate in resolution.candidates:
        chosen = resolution.chosen is not None and candidate.key == resolution.chosen.key
        detail = "; ".join(candidate.reasons + candidate.notes + [candidate.ranked_by] * bool(candidate.ranked_by)) \
            or "-"
        row = ["→" if chosen else "", candidate.key[:12], candidate.kind, candidate.recipe, candidate.target,
               f"{candidate.tp}×{candidate.pp}", size_label(candidate.total_bytes)]
        if slo is not None:
            profile = candidate.profile
            meets = profile is not None and profile.meets
            row += [profile.profile if meets and profile else "-",
                    f"c={profile.concurrency}" if meets and profile else "-",
                    f"{profile.goodput:.2f}" if meets and profile and profile.goodput is not None else "-",
                    f"{profile.output_throughput:,.1f}" if meets and profile and profile.output_throughput else "-"]
        else:
            spread = "" if candidate.metric_low is None or candidate.metric_high is None or \
                candidate.metric_low == candidate.metric_high else \
                f" ({candidate.metric_low:,.1f}–{candidate.metric_high:,.1f})"
            row.append("-" if candidate.metric is None else f"{candidate.metric:,.1f}{spread}")
            if candidate.accuracy is not None and candidate.ranked_by:
                row[-1] += f", accuracy {candidate.accuracy:.3f}"
        rows.append([*row, styled(candidate.status, colour[candidate.status]), detail])
    columns = ["", "key", "kind", "recipe", "target", "tp×pp", "size"]
    columns += ["profile", "at", "goodput req/s", "tok/s"] if slo is not None else [metric_name]
    title = f"{resolution.model} on {resolution.machine.description}" + (f" for SLO {slo}" if slo else "")
    stdout.print(table(title, [*columns, "status", "why"], rows))
    for note in resolution.machine.notes:
        stdout.print(f"[yellow]note:[/] {escape(note)}", markup=True)
    if resolution.chosen is not None:
        chosen_profile = resolution.chosen.profile
        by = (f"profile {chosen_profile.profile} at c={chosen_profile.concurrency}: the most goodput within the SLO"
              if chosen_profile is not None and chosen_profile.meets else resolution.chosen.ranked_by
              or f"by {resolution.constraints.objective}")
        stdout.print(f"chosen: [bold]{escape(resolution.chosen.model)}@{resolution.chosen.key[:12]}[/] ({escape(by)})",
                     markup=True)
    elif resolution.candidates:
        if slo is not None:
            stdout.print("no profile meets the SLO here", style="red")
        elif not_chosen is not None:
            stdout.print(not_chosen, style="red")


# The toolchain a build is known by, first found first, where no version changed since the previous build.
_MAIN_VERSIONS = ("tensorrt_llm", "vllm", "onnxruntime", "tensorrt", "modelopt", "torch", "transformers")
_STATUS_COLOUR = {"built": "green", "gate-failed": "yellow", "failed": "red", "no-worker": "red"}


def _print_history(result: ModelHistory, location: str) -> None:
    from registry.manifest import display_timestamp

    # Every string from a record is data: printed as it is (markup off), or escaped where a cell is styled, so that
    # "[/weights]" in a reason is printed, not parsed.
    if not result.cells:
        stdout.print(f"No builds of {result.model} in {location}.")
    for cell in result.cells:
        rows = [_history_row(build, cell.builds[:index]) for index, build in enumerate(cell.builds)]
        count = f"{len(cell.builds)} build" + ("s" if len(cell.builds) != 1 else "")
        builds = table(f"{cell.cell} ({count}, oldest first)",
                       ["date (UTC)", "key", "status", "checkpoint", "toolchain", "throughput ratio", "TPOT ratio",
                        "accuracy", "gates", "channels", "regressions"], rows)
        builds.columns[-1].no_wrap = True  # one regression a line, whole: the column people scan for
        stdout.print(builds)
    if result.channel_moves:
        stdout.print(table(f"Channel moves of {result.model}", ["date (UTC)", "channel", "key", "was", "by"], [
            [display_timestamp(m.recorded), m.channel, m.key[:12], (m.previous or "-")[:12], m.actor]
            for m in result.channel_moves]))
    for record in result.unreadable:
        stderr.print(f"[yellow]unreadable[/] history record {escape(record.entry)}: {escape(record.problem)}",
                     markup=True)


def _history_row(build: BuildEntry, earlier: list[BuildEntry]) -> list[Text]:
    from registry.history import describe_regression, version_changes
    from registry.manifest import display_timestamp

    outcome = build.outcome
    previous = next((b.outcome for b in reversed(earlier) if b.outcome.versions), None)
    changes = version_changes(previous, outcome)
    if changes:
        toolchain = ", ".join(f"{name} {old or '-'}→{new or '-'}" for name, (old, new) in changes.items())
    else:
        toolchain = ", ".join([f"{name} {outcome.versions[name]}" for name in _MAIN_VERSIONS
                               if name in outcome.versions][:2]) or "-"
    status = f"[{_STATUS_COLOUR[outcome.status]}]{outcome.status}[/]" + (", published" if build.published else "")
    if outcome.reason and outcome.status != "built":
        status += f": {escape(outcome.reason)}"
    failed_gates = [g.name for g in outcome.gates if not g.passed]
    gates = {True: "[green]pass[/]", False: f"[red]fail[/] ({escape(', '.join(failed_gates) or '?')})", None: "-"}[
        outcome.passed]
    regressions = "\n".join(f"[red]{escape(describe_regression(r))}[/]" for r in build.regressions) or "-"
    accuracy = ", ".join(f"{task} {score:.3f}" for task, score in sorted(outcome.accuracy.items())) or "-"
    checkpoint = (outcome.commit_sha or "-").removeprefix("sha256:")[:12]  # a local directory's is its digest
    cells = [escape(display_timestamp(outcome.recorded)), escape((outcome.key or "-")[:12]), status,
             escape(checkpoint), escape(toolchain), escape(_spread_text(build, "throughput_ratio")),
             escape(_latency_text(build)), escape(accuracy), gates, escape(", ".join(build.channels) or "-"),
             regressions]
    return [Text.from_markup(cell) for cell in cells]  # markup written here, every value escaped


def _latency_text(build: BuildEntry) -> str:
    """TPOT's ratio, or E2EL's where the servers' TPOT was not observable (what the latency gate then compared)."""
    if "tpot_ratio" in build.outcome.metrics or "e2el_ratio" not in build.outcome.metrics:
        return _spread_text(build, "tpot_ratio")
    return _spread_text(build, "e2el_ratio") + " (E2EL)"


def _spread_text(build: BuildEntry, metric: str) -> str:
    spread = build.outcome.metrics.get(metric)
    return "-" if spread is None else f"{spread.median:.3f} ±{spread.half_range:.3f}"


def _write_history_plots(result: ModelHistory, out_dir: Path) -> list[Path]:
    try:
        from registry.history_plots import write_history_plots
        from registry.names import safe_file_name
    except ImportError as exc:
        raise UserError(f"plots need matplotlib ({exc})", where="--plots",
                        hint="install enginesmith with the validation extra: pip install 'enginesmith[validation]'"
                        ) from None
    cells: list[CellHistory] = result.cells
    return [path for cell in cells for path in write_history_plots(cell, out_dir / safe_file_name(cell.cell))]


def _read_json_file(path: Path, option: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist", where=option) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON: {exc.msg} (line {exc.lineno})", where=str(path)) from None
    if not isinstance(value, dict):
        raise UserError("the report must be a JSON object", where=str(path))
    return value


def _limiter(limit_rate: str | None) -> RateLimiter | None:
    from registry.transfer import RateLimiter, parse_rate

    if limit_rate is None:
        return None
    try:
        return RateLimiter(parse_rate(limit_rate))
    except ValueError as exc:
        raise UserError(str(exc), where="--limit-rate") from None


def _sm(sm: int | None) -> str:
    return "-" if sm is None else f"{sm // 10}.{sm % 10}"


class _RichProgress:
    """Transfer progress as rich bars on stderr: one for the whole transfer, one per file in flight."""

    def __init__(self, progress: Progress, verb: str, total_bytes: int | None) -> None:
        self._progress = progress
        self._verb = verb
        self._grow_total = total_bytes is None
        # With nothing to transfer there is no bar at all.
        self._overall = progress.add_task(verb, total=total_bytes) if total_bytes else None
        self._tasks: dict[str, TaskID] = {}

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        if self._overall is None:
            self._overall = self._progress.add_task(self._verb, total=0)
        self._tasks[name] = self._progress.add_task(f"  {name}", total=total_bytes, completed=done_bytes)
        if self._grow_total:
            task = self._progress.tasks[self._overall]
            self._progress.update(self._overall, total=(task.total or 0) + total_bytes - done_bytes)

    def advanced(self, name: str, bytes_count: int) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self._progress.advance(task, bytes_count)
        if self._overall is not None:
            self._progress.advance(self._overall, bytes_count)

    def finished(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            self._progress.remove_task(task)


@contextmanager
def _transfer_progress(*, enabled: bool, verb: str, total_bytes: int | None = None) -> Iterator[_RichProgress | None]:
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=stderr, transient=False) as progress:
        yield _RichProgress(progress, verb, total_bytes)
