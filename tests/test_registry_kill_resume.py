"""#52: publishes and pulls killed at random bytes of their traffic, 20 times each, on S3 (SeaweedFS) and OCI
(docker-registry), then finished: what crossed the network in all, and the artefact verified at the end.

No rate limit and no chosen moment: a relay (``tests.killing_proxy``) SIGKILLs the CLI when the bytes it moved cross
a random offset, mid-part and mid-chunk as often as not. Each resume asks the server what it holds (S3's ListParts,
the OCI upload status) or reads its own partial file (pull), so a kill loses only what was in flight:
- an S3 publish, the parts being sent (S3 keeps whole parts only): at most ``UPLOAD_THREADS_PER_BLOB`` parts a kill;
- a pull, what the kernel held between the server and the killed process (the relay's send buffer and the client's
  receive buffer, at most their configured maxima) and one chunk read but not yet written;
- an OCI publish on docker-registry, the blob's session: distribution cancels an upload whose signed state is behind
  the bytes it stored (a kill mid-chunk), so that blob starts again; bounded by the blob, measured in the bench.
``bench/registry_kill_resume.py`` runs the same at 2 GiB for the ratios.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from registry.s3 import UPLOAD_THREADS_PER_BLOB
from tests.kill_resume import KillReport, kill_and_resume
from tests.killing_proxy import RELAY_BYTES, KillingProxy
from tests.oci_registry import OciRegistry
from tests.registry_helpers import MIB, artefact_with_weights, read_artefact, registry_env
from tests.seaweedfs import SeaweedServer, requires_weed

pytestmark = [requires_weed, pytest.mark.slow]

SIZE = 128 * MIB
KILLS = 20
PART_MIB = 5
HEADERS_PER_KILL = 64 * 1024  # the requests a run makes before and around its parts (listing, HEADs, its headers)
REQUESTS_PER_RUN = 1 * MIB  # all the requests of a whole publish, beside its blobs' bytes


def kernel_buffer_bytes() -> int:
    """The most a loopback TCP connection can hold in flight: the sender's and the receiver's buffer maxima."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    return wmem + rmem


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return artefact_with_weights(tmp_path_factory.mktemp("kill-resume") / "build", SIZE)


def publish_then_pull(url: str, extra: dict[str, str], proxy: KillingProxy, source: Path, tmp_path: Path,
                      seed: int) -> tuple[KillReport, KillReport]:
    rng = random.Random(seed)
    size = sum(f.size for f in read_artefact(source).files)
    published = kill_and_resume(["publish", str(source)], env=registry_env(url, tmp_path / "cache", extra),
                                proxy=proxy, direction="up", total_bytes=size, kills=KILLS, rng=rng,
                                log_dir=tmp_path / "publish-logs")
    dest = tmp_path / "pulled"
    pulled = kill_and_resume(["pull", f"tiny-llama@{read_artefact(source).key}", "--dest", str(dest)],
                             env=registry_env(url, tmp_path / "pull-cache", extra), proxy=proxy, direction="down",
                             total_bytes=size, kills=KILLS, rng=rng, log_dir=tmp_path / "pull-logs")
    weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
    with (dest / weights.path).open("rb") as handle:
        assert hashlib.file_digest(handle, "sha256").hexdigest() == weights.sha256
    assert published.kills == KILLS and pulled.kills == KILLS
    print(f"publish: {published.relayed / MIB:.1f} MiB sent for {size / MIB:.1f} MiB ({published.ratio:.3f}x), "
          f"pull: {pulled.relayed / MIB:.1f} MiB ({pulled.ratio:.3f}x)")
    return published, pulled


def assert_pull_lost_only_what_was_in_flight(pulled: KillReport) -> None:
    in_flight = kernel_buffer_bytes() + 2 * RELAY_BYTES + 1 * MIB  # the kernel's buffers, a chunk being written
    assert pulled.relayed <= pulled.total_bytes + pulled.kills * in_flight, pulled


def test_an_s3_publish_and_pull_killed_at_random_bytes_lose_only_what_was_in_flight(
    seaweedfs: SeaweedServer, prefix: str, source: Path, tmp_path: Path
) -> None:
    proxy = KillingProxy(seaweedfs.ports["s3"])
    try:
        extra = {**seaweedfs.env, "AWS_ENDPOINT_URL": f"http://{proxy.address}", "ENGINESMITH_S3_PART_MIB":
                 str(PART_MIB)}
        published, pulled = publish_then_pull(seaweedfs.registry_url(prefix), extra, proxy, source, tmp_path, 52)
    finally:
        proxy.close()
    parts_in_flight = UPLOAD_THREADS_PER_BLOB * PART_MIB * MIB
    assert published.relayed <= published.total_bytes + published.kills * (parts_in_flight + HEADERS_PER_KILL)
    assert_pull_lost_only_what_was_in_flight(pulled)


def test_an_oci_publish_and_pull_killed_at_random_bytes_finish_verified(
    oci_registry: OciRegistry, source: Path, tmp_path: Path
) -> None:
    proxy = KillingProxy(oci_registry.port)
    try:
        url = f"oci+http://{proxy.address}/kill-resume-{random.Random().randrange(10**9)}"
        published, pulled = publish_then_pull(url, oci_registry.env, proxy, source, tmp_path, 53)
    finally:
        proxy.close()
    # A cancelled session costs that blob again, never more: each run sends at most the artefact and its requests
    # (manifest, records, the headers of every chunk, mount and check).
    assert max(published.per_run) <= published.total_bytes + REQUESTS_PER_RUN
    assert_pull_lost_only_what_was_in_flight(pulled)
