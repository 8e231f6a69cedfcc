"""A small disk for the tests: a size-limited tmpfs mounted in a private mount namespace (``unshare --user
--map-root-user --mount``, which needs no root on the host), so a test sees a real full filesystem without touching
the machine's. ``on_small_disk`` runs this file as a script in such a namespace; the script mounts the tmpfs, runs
one scenario onto it and prints what it saw as JSON (the mount vanishes with the namespace).

    python tests/small_disk.py SCENARIO MOUNT_POINT SIZE_MIB ARG...

``pull-cli REGISTRY``: ``enginesmith pull`` with its cache and destination on the small disk.
``pull-filled REGISTRY``: a pull in this process whose first write is followed by another writer filling the disk.
``cli ARG...``: ``enginesmith ARG...`` with ``{disk}`` in the arguments replaced by the mount point.
``cli-read-only ARG...``: the same, with a read-only tmpfs mounted at ``{disk}/read-only``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def pull_cli(mount_point: Path, registry: Path) -> dict:
    free_before = free_bytes(mount_point)
    env = {**os.environ, "ENGINESMITH_REGISTRY": str(registry), "ENGINESMITH_CACHE_DIR": str(mount_point / "cache")}
    finished = subprocess.run([sys.executable, "-m", "enginesmith", "pull", "tiny-llama", "--dest",
                               str(mount_point / "dest")], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    return {"returncode": finished.returncode, "stderr": finished.stderr, "free_before": free_before,
            "files_after": files_under(mount_point)}


class FillDiskAfterFirstWrite:
    """Progress that, after the pull's first write, fills the disk from another file (as another job would)."""

    def __init__(self, filler: Path) -> None:
        self.filler = filler
        self.filled = False

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, name: str, bytes_count: int) -> None:
        if self.filled:
            return
        self.filled = True
        block = b"\0" * (1024 * 1024)
        with self.filler.open("wb") as handle:
            try:
                while True:
                    handle.write(block)
                    handle.flush()
            except OSError:
                pass

    def finished(self, name: str) -> None:
        pass


def pull_filled(mount_point: Path, registry: Path) -> dict:
    from registry.cache import BlobCache
    from registry.catalog import find_manifest
    from registry.local import LocalStore
    from registry.names import Ref
    from registry.pull import pull_artefact

    store = LocalStore(registry)
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    cache = BlobCache(mount_point / "cache")
    dest = mount_point / "dest"
    seen: dict = {"error": None, "message": ""}
    try:
        pull_artefact(store, manifest, dest=dest, cache=cache,
                      progress=FillDiskAfterFirstWrite(mount_point / "filler"))
    except Exception as exc:  # reported to the test, which asserts on it
        seen = {"error": type(exc).__name__, "message": str(exc)}
    digest = str(manifest.artefact.files[0].sha256)
    blobs_dir = cache.root / "blobs" / "sha256"
    return {**seen, "partials": [str(p) for p in cache.partials(digest)],
            "blobs": files_under(blobs_dir) if blobs_dir.exists() else [], "dest_exists": dest.exists(),
            "staging": [p.name for p in mount_point.iterdir() if p.name.startswith(".")]}


def cli(mount_point: Path, *args: str) -> dict:
    free_before = free_bytes(mount_point)
    argv = [arg.replace("{disk}", str(mount_point)) for arg in args]
    finished = subprocess.run([sys.executable, "-m", "enginesmith", *argv], capture_output=True, text=True,
                              cwd=REPO_ROOT)
    return {"returncode": finished.returncode, "stderr": finished.stderr, "free_before": free_before,
            "files_after": files_under(mount_point)}


@functools.cache
def namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


def requires_mount_namespace(test: Any) -> Any:
    """Skip ``test`` where this machine allows no private mount namespace with a tmpfs."""
    import pytest

    return pytest.mark.skipif(not namespaces_allowed(), reason="needs `unshare --user --mount` and tmpfs mounts "
                              "(util-linux, unprivileged user namespaces)")(test)


def on_small_disk(tmp_path: Path, size_mib: int, scenario: str, *args: str) -> dict:
    """Run ``SCENARIO ARGS`` in its own mount namespace with a ``size_mib`` tmpfs at ``tmp_path/small``; returns
    what it printed."""
    mount_point = tmp_path / "small"
    mount_point.mkdir(parents=True)
    command = ["unshare", "--user", "--map-root-user", "--mount", sys.executable, __file__, scenario,
               str(mount_point), str(size_mib), *args]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def main() -> None:
    scenario, mount_point, size_mib, args = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)], check=True)
    if scenario == "cli-read-only":
        (mount_point / "read-only").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount_point / "read-only")],
                       check=True)
    if scenario.startswith("cli"):
        seen = cli(mount_point, *args)
    else:
        seen = {"pull-cli": pull_cli, "pull-filled": pull_filled}[scenario](mount_point, Path(args[0]))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
