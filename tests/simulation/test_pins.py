"""The order app's behaviour for fixed seeds, pinned (tests/simulation/pins.py): the trace and the documents."""

from __future__ import annotations

import json

import pytest

from tests.simulation.pins import PINS, SEEDS, fingerprint

PINNED = json.loads(PINS.read_text())


def test_every_seed_is_pinned() -> None:
    assert sorted(map(int, PINNED)) == list(SEEDS)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_trace_and_the_documents_are_as_pinned(seed: int) -> None:
    assert fingerprint(seed) == PINNED[str(seed)], (
        f"seed {seed} ran differently: if the change is meant to change behaviour, regenerate the pins with "
        "`.venv/bin/python -m tests.simulation.pins` and say why in the commit")
