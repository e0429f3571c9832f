"""The deployed dependencies: ``requirements.in`` holds the ranges, ``requirements.txt`` the lock made from them.

Azure's remote build installs ``requirements.txt`` on the day of each deploy, so it holds exact versions with
their hashes (pip then installs nothing else), generated from ``requirements.in`` by uv (``make lock``,
``python -m deps lock``). The lock is universal: one resolution for every Python the template allows
(3.11 to 3.13) and every platform, with markers where they differ. ``python -m deps check`` fails when the lock
and the ranges disagree, and ``make setup`` installs the test environment under the lock, so the tests run
on exactly what is deployed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
RANGES = ROOT / "requirements.in"
LOCK = ROOT / "requirements.txt"
#: The oldest Python the template allows; the universal lock holds for it and every later one.
PYTHON_FLOOR = "3.11"
#: The Pythons a deploy may run (infra/main.bicep's pythonVersion), each on Linux.
TARGETS = ("3.11", "3.12", "3.13")
#: What ``# via`` says of a pin that requirements.in names itself.
DIRECT = "-r requirements.in"


def compile_command(output: Path) -> list[str]:
    """The uv command that makes the lock from ``requirements.in`` in the working directory: universal,
    hashed, with ``make lock`` named in its header.

    uv keeps every pin already in ``output`` that still satisfies the ranges, so running it over the
    committed lock changes only what the ranges force.
    """
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    return [uv, "pip", "compile", RANGES.name, "--universal", "--python-version", PYTHON_FLOOR,
            "--generate-hashes", "--custom-compile-command", "make lock", "--quiet", "--output-file", str(output)]


@dataclass(frozen=True)
class Pin:
    """One locked distribution: its version, the markers it holds under, its hashes and what needs it."""

    name: str
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]
    via: tuple[str, ...]

    def applies(self, python: str) -> bool:
        """Whether this pin is installed on Linux under ``python`` (a major.minor version)."""
        if self.marker is None:
            return True
        return self.marker.evaluate({"python_version": python, "python_full_version": f"{python}.0",
                                     "sys_platform": "linux", "platform_system": "Linux",
                                     "implementation_name": "cpython", "platform_python_implementation": "CPython",
                                     "platform_machine": "x86_64"})


def read_lock(text: str) -> list[Pin]:
    """The pins of a requirements file that uv wrote with hashes and ``# via`` annotations."""
    pins: list[Pin] = []
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        if not block or block.startswith("#"):
            continue
        head = block.splitlines()[0].rstrip("\\ ")
        requirement = Requirement(head)
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==":
            raise ValueError(f"requirements.txt: {head!r} is not pinned with ==")
        specifier = specifiers[0]
        after = block.split("# via", 1)[1] if "# via" in block else ""
        via = [line.strip().lstrip("#").strip() for line in after.splitlines()]
        pins.append(Pin(canonicalize_name(requirement.name), specifier.version, requirement.marker,
                        tuple(re.findall(r"--hash=(\S+)", block)), tuple(v for v in via if v)))
    return pins


def read_ranges(text: str) -> list[Requirement]:
    """The requirements of a ranges file (comments, blank lines and options left out)."""
    return [Requirement(line.split("#", 1)[0].strip()) for line in text.splitlines()
            if line.split("#", 1)[0].strip() and not line.lstrip().startswith("-")]


def findings(ranges_text: str, lock_text: str) -> list[str]:
    """Where the lock and the ranges disagree, one line each; empty when the lock is the ranges' lock.

    Checked without the network: every range is pinned, within the range, for each target Python; every
    pin has hashes; the pins uv marked as direct are exactly the ranges' names; every other pin is needed
    by another pin.
    """
    pins = read_lock(lock_text)
    ranges = read_ranges(ranges_text)
    found: list[str] = []
    for requirement in ranges:
        name = canonicalize_name(requirement.name)
        for python in TARGETS:
            if requirement.marker is not None and not Pin(name, "", requirement.marker, (), ()).applies(python):
                continue
            versions = [pin.version for pin in pins if pin.name == name and pin.applies(python)]
            if not versions:
                found.append(f"{requirement} is not locked for Python {python}")
            elif not all(requirement.specifier.contains(v, prereleases=True) for v in versions):
                found.append(f"{requirement} is locked at {', '.join(versions)} for Python {python}, outside its range")
    names = {canonicalize_name(r.name) for r in ranges}
    locked = {pin.name for pin in pins}
    for pin in pins:
        if not pin.hashes:
            found.append(f"{pin.name}=={pin.version} has no hash")
        if DIRECT in pin.via and pin.name not in names:
            found.append(f"{pin.name}=={pin.version} is locked as a requirement that requirements.in no longer has")
        needers = {canonicalize_name(v) for v in pin.via if v != DIRECT}
        if pin.name not in names and not needers & locked:
            found.append(f"{pin.name}=={pin.version} is locked, but nothing in requirements.in needs it")
    return sorted(set(found))


def resolved_again(ranges: Path = RANGES, lock: Path = LOCK) -> str:
    """The lock uv makes from the ranges, starting from the committed lock (needs the package index)."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder, "requirements.txt")
        shutil.copyfile(lock, output)
        shutil.copyfile(ranges, Path(folder, "requirements.in"))
        subprocess.run(compile_command(output), check=True, cwd=folder,  # noqa: S603 (our own command)
                       capture_output=True, text=True, timeout=300)
        return output.read_text()


def installed_differences(lock_text: str, python: str | None = None) -> Iterator[str]:
    """Each pin that applies to this interpreter and is not installed at its locked version."""
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    for pin in read_lock(lock_text):
        if not pin.applies(python):
            continue
        try:
            version = metadata.version(pin.name)
        except metadata.PackageNotFoundError:
            yield f"{pin.name}=={pin.version} is locked but not installed"
            continue
        if version != pin.version:
            yield f"{pin.name} is {version} here but locked at {pin.version}"
