"""What the order app does, pinned for fixed seeds: the simulator's trace and every document the run leaves in the
store, byte for byte, each as a sha256. A change meant to change no behaviour (the library's refactors, issue 42)
must leave every pin as it is; one that changes behaviour says so by regenerating them in the same commit:

    .venv/bin/python -m tests.simulation.pins      # rewrites tests/simulation/pins.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import msgspec

from simulation.run import simulate
from simulation.world import World

PINS = Path(__file__).resolve().parent / "pins.json"
#: Sessions and plain events queues, storms, outages, foreign writers and limits all occur among these seeds.
SEEDS = tuple(range(1, 25))
#: Fields the store sets that are random by design (an etag is a fresh uuid).
UNPINNED = ("_etag",)


def documents_digest(world: World) -> str:
    """The sha256 of every live document, in the order (partition, id), each as the app's JSON bytes."""
    hasher = hashlib.sha256()
    for document in sorted(world.store.documents(), key=lambda d: (str(d.get("orderId")), str(d["id"]))):
        hasher.update(msgspec.json.encode({k: v for k, v in document.items() if k not in UNPINNED}))
        hasher.update(b"\n")
    return hasher.hexdigest()


def fingerprint(seed: int) -> dict[str, str]:
    """The pins of one seed: its trace and its documents."""
    worlds: list[World] = []
    report = simulate(seed, trace=True, observe=worlds.append)
    return {"trace": hashlib.sha256("\n".join(report.trace or ()).encode()).hexdigest(),
            "documents": documents_digest(worlds[0])}


def main() -> int:
    PINS.write_text(json.dumps({str(seed): fingerprint(seed) for seed in SEEDS}, indent=1) + "\n")
    print(f"wrote {PINS.name}: {len(SEEDS)} seeds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
