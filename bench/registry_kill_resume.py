"""Publishes and pulls killed at random bytes, many times, on S3 (SeaweedFS) and OCI (Debian's docker-registry): how
many bytes each server was sent (publish) or sent (pull) in all, against the artefact's size.

Usage: python bench/registry_kill_resume.py [--size-mib 2048] [--kills 20] [--part-mib 5] [--stores s3,oci]
       [--seed 1]

Each run of the real CLI is SIGKILLed when the bytes it moved through a counting relay cross an offset drawn
uniformly from [64 KiB, 1.5 × size / kills) (``tests.kill_resume``), ``--kills`` times, then one run finishes; the
pulled weights are checked against their sha256. A kill mid-part on S3 loses the parts in flight (S3 keeps only whole
parts: at most 2 × ``--part-mib`` per kill); on OCI a publish resumes from the offset the registry reports, and
docker-registry cancels a session whose upload state is behind the bytes it stored (a kill mid-chunk), so that blob
starts again. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kill_resume import KillReport, kill_and_resume
from tests.killing_proxy import KillingProxy
from tests.registry_helpers import MIB, artefact_with_weights, read_artefact, registry_env


def run_store(store: str, source: Path, work: Path, kills: int, part_mib: int, rng: random.Random
              ) -> dict[str, KillReport | float]:
    import contextlib

    size = sum(f.size for f in read_artefact(source).files)
    with contextlib.ExitStack() as stack:
        if store == "s3":
            from tests.seaweedfs import BUCKET, running_seaweedfs

            server = stack.enter_context(running_seaweedfs(work / "seaweedfs"))
            proxy = KillingProxy(server.ports["s3"])
            url = f"s3://{BUCKET}/kill-resume"
            extra = {**server.env, "AWS_ENDPOINT_URL": f"http://{proxy.address}",
                     "ENGINESMITH_S3_PART_MIB": str(part_mib)}
        else:
            from tests.oci_registry import running_oci_registry

            registry = stack.enter_context(running_oci_registry(work / "oci"))
            proxy = KillingProxy(registry.port)
            url = f"oci+http://{proxy.address}/kill-resume"
            extra = registry.env
        stack.callback(proxy.close)
        started = time.monotonic()
        published = kill_and_resume(["publish", str(source)], env=registry_env(url, work / f"{store}-cache", extra),
                                    proxy=proxy, direction="up", total_bytes=size, kills=kills, rng=rng,
                                    log_dir=work / f"{store}-publish-logs")
        publish_s = time.monotonic() - started
        key = read_artefact(source).key
        dest = work / f"{store}-pulled"
        started = time.monotonic()
        pulled = kill_and_resume(["pull", f"tiny-llama@{key}", "--dest", str(dest)],
                                 env=registry_env(url, work / f"{store}-pull-cache", extra), proxy=proxy,
                                 direction="down", total_bytes=size, kills=kills, rng=rng,
                                 log_dir=work / f"{store}-pull-logs")
        pull_s = time.monotonic() - started
        weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
        with (dest / weights.path).open("rb") as handle:
            assert hashlib.file_digest(handle, "sha256").hexdigest() == weights.sha256, "pulled weights differ"
    return {"publish": published, "pull": pulled, "publish_s": publish_s, "pull_s": pull_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--part-mib", type=int, default=5)
    parser.add_argument("--stores", default="s3,oci")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kill-resume-", dir=os.environ.get("TMPDIR")) as scratch:
        work = Path(scratch)
        source = artefact_with_weights(work / "build", args.size_mib * MIB)
        for store in args.stores.split(","):
            result = run_store(store, source, work, args.kills, args.part_mib, rng)
            for verb in ("publish", "pull"):
                report = result[verb]
                assert isinstance(report, KillReport)
                rows.append({"store": store, "verb": verb, "size_mib": report.total_bytes / MIB,
                             "kills": report.kills, "runs": len(report.per_run),
                             "received_mib": round(report.relayed / MIB, 1), "ratio": round(report.ratio, 4),
                             "waste_per_kill_mib": round(report.waste_per_kill / MIB, 2),
                             "seconds": round(float(result[f"{verb}_s"]), 1)})
    print(f"{'store':6} {'verb':8} {'size MiB':>9} {'kills':>6} {'received MiB':>13} {'ratio':>7} "
          f"{'lost/kill MiB':>14} {'s':>7}")
    for row in rows:
        print(f"{row['store']:6} {row['verb']:8} {row['size_mib']:9.0f} {row['kills']:6d} {row['received_mib']:13.1f} "
              f"{row['ratio']:7.4f} {row['waste_per_kill_mib']:14.2f} {row['seconds']:7.1f}")
    print(json.dumps({"bench": "registry_kill_resume", "part_mib": args.part_mib, "seed": args.seed, "rows": rows}))


if __name__ == "__main__":
    main()
