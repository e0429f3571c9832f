"""A chaos run that ends early halts its killer before its stack stops the hosts: none is brought back after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.faults import Chaos, Slot


class Stack:
    """A stack whose hosts are all gone: starting one is what a halted run must never do."""

    def __init__(self) -> None:
        self.hosts: list[Any] = []
        self.retired: list[Any] = []
        self.started = 0

    def start_host(self, settings: Path, app_dir: Path) -> Any:
        self.started += 1
        return object()


def test_a_halted_run_starts_no_host_for_a_dead_slot_or_a_replacement(tmp_path: Path) -> None:
    stack: Any = Stack()
    chaos = Chaos(stack, 1, tmp_path)
    chaos.slots = [Slot(0, None, None, tmp_path / "settings.json", tmp_path)]  # type: ignore[arg-type]
    chaos._replace_dead()
    assert stack.started == 1  # running, a dead slot is brought back
    chaos.slots[0].host = None
    chaos.halt()
    chaos._replace_dead()
    chaos._replace(chaos.slots[0], tmp_path)
    assert stack.started == 1
