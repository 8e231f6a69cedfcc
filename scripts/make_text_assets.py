"""Write the English text assets from the Python reference documentation that ships with CPython
(``pydoc_data.topics``, PSF License): human-written prose, no download needed.

- ``enginesmith/assets/calibration/pydocs-calib.txt``: calibration text (``builtin:pydocs``), one paragraph a line.
- ``enginesmith/assets/text/pydocs-heldout.txt``: held-out paragraphs for perplexity, from topics calibration
  never sees (a topic is held out when a hash of its name says so).

The files are committed, so keys do not move with the Python version that runs this script.
Usage: python scripts/make_text_assets.py
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from pydoc_data.topics import topics

REPO_ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = REPO_ROOT / "enginesmith" / "assets" / "calibration" / "pydocs-calib.txt"
HELD_OUT = REPO_ROOT / "enginesmith" / "assets" / "text" / "pydocs-heldout.txt"
HELD_OUT_MODULUS = 6
MIN_WORDS = 25  # prose paragraphs, not code lines or headings
HELD_OUT_CHARS = 24_000


def is_held_out(topic: str) -> bool:
    return hashlib.blake2b(topic.encode(), digest_size=8).digest()[0] % HELD_OUT_MODULUS == 0


def paragraphs(text: str) -> list[str]:
    found = []
    for block in re.split(r"\n\s*\n", text):
        if block.startswith(("   ", "\t")) or ">>>" in block:  # indented code and examples
            continue
        line = " ".join(block.split())
        if len(line.split()) >= MIN_WORDS and not line.startswith("*"):
            found.append(line)
    return found


def main() -> None:
    calibration, held_out = [], []
    for topic in sorted(topics):
        (held_out if is_held_out(topic) else calibration).extend(paragraphs(topics[topic]))
    kept, size = [], 0
    for paragraph in held_out:
        if size >= HELD_OUT_CHARS:
            break
        kept.append(paragraph)
        size += len(paragraph)
    CALIBRATION.write_text("".join(p + "\n" for p in calibration))
    HELD_OUT.parent.mkdir(parents=True, exist_ok=True)
    HELD_OUT.write_text("".join(p + "\n" for p in kept))
    print(f"{CALIBRATION}: {len(calibration)} paragraphs; {HELD_OUT}: {len(kept)} paragraphs, {size} characters")


if __name__ == "__main__":
    main()
