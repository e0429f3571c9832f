"""Regenerate ``types.json`` beside this file: Azure's published resource types, trimmed to what the template uses.

Azure's types for Bicep are generated from the REST API specs into the public repository
``Azure/bicep-types-az`` (``generated/<provider>/<namespace>/<api-version>/types.json``, each a JSON array of
type entries that refer to each other as ``{"$ref": "#/<index>"}``). This script finds the ``ResourceType``
of every ``Type@api-version`` the templates under ``infra/`` name, copies every entry reachable from it into
one array (refs renumbered, descriptions left out), and writes it with the source commit:

    git clone --filter=blob:none https://github.com/Azure/bicep-types-az /tmp/bicep-types-az
    .venv/bin/python -m tests.infra.azure_types.regenerate /tmp/bicep-types-az

A bare git directory works too (``--git-dir``). ``tests/infra/test_azure_types.py`` checks the template against
the file, and that it holds every type the template names.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.infra.bicep import bicep_files, parse

OUTPUT = Path(__file__).resolve().parent / "types.json"

_Key = tuple[str, int]  # (types.json path, entry index)


def declared_types() -> list[str]:
    """Every ``Type@api-version`` the Bicep files under infra/ declare (nested child resources too), sorted."""
    return sorted({f"{resource['type']}@{resource['api_version']}" for path in bicep_files()
                   for resource in parse(path).get("resources", {}).values()})


class Source:
    """The types files of one commit of Azure/bicep-types-az, from a checkout or a bare git directory."""

    def __init__(self, root: Path, *, bare: bool) -> None:
        self.root, self.bare = root, bare
        self.commit = self._git("rev-parse", "HEAD").strip()
        self._loaded: dict[str, list[dict[str, Any]]] = {}

    def _git(self, *args: str) -> str:
        where = [f"--git-dir={self.root}"] if self.bare else ["-C", str(self.root)]
        done = subprocess.run(["git", *where, *args], capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"error: git {' '.join(args)} failed in {self.root}: {done.stderr.strip()}")
        return done.stdout

    def files(self) -> list[str]:
        """Every types.json under generated/, sorted by their lower-cased path (bicep-types' own tie-break)."""
        listing = self._git("ls-tree", "-r", "--name-only", "HEAD", "generated")
        return sorted((p for p in listing.splitlines() if p.endswith("/types.json")), key=str.lower)

    def load(self, path: str) -> list[dict[str, Any]]:
        if path not in self._loaded:
            text = self._git("show", f"HEAD:{path}") if self.bare else (self.root / path).read_text()
            self._loaded[path] = json.loads(text)
        return self._loaded[path]


def locate(source: Source, wanted: list[str]) -> tuple[dict[str, _Key], list[str]]:
    """Each wanted type's ResourceType entry (names compared without case), and those not found."""
    found: dict[str, _Key] = {}
    files = source.files()
    for name in wanted:
        kind, _, version = name.partition("@")
        tail = f"/{kind.split('/')[0].lower()}/{version.lower()}/types.json"
        for path in (p for p in files if p.lower().endswith(tail)):
            hits = [i for i, t in enumerate(source.load(path))
                    if t.get("$type") == "ResourceType" and str(t.get("name", "")).lower() == name.lower()]
            if hits:
                found[name] = (path, hits[0])
                break
    return found, [name for name in wanted if name not in found]


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {"$ref"}:
            yield value["$ref"]
        else:
            for item in value.values():
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _target(ref: str, path: str) -> _Key:
    file_part, _, index = ref.partition("#/")
    return (posixpath.normpath(posixpath.join(posixpath.dirname(path), file_part)) if file_part else path, int(index))


def trimmed(source: Source, roots: dict[str, _Key]) -> dict[str, Any]:
    """The entries reachable from ``roots`` in one array, refs renumbered, descriptions left out."""
    order: dict[_Key, int] = {}
    pending = list(roots.values())
    while pending:
        key = pending.pop()
        if key in order:
            continue
        order[key] = len(order)
        pending += [_target(ref, key[0]) for ref in _refs(source.load(key[0])[key[1]])]

    def rewrite(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            if set(value) == {"$ref"}:
                return {"$ref": f"#/{order[_target(value['$ref'], path)]}"}
            # The text of a type or a property ("$type", or "type" and "flags" beside it), not a property so named.
            prose = "$type" in value or {"type", "flags"} <= set(value)
            return {k: rewrite(v, path) for k, v in value.items() if not (prose and k == "description")}
        if isinstance(value, list):
            return [rewrite(v, path) for v in value]
        return value

    types = [rewrite(source.load(path)[index], path) for (path, index) in order]
    return {"source": {"repository": "https://github.com/Azure/bicep-types-az", "commit": source.commit},
            "resources": {name: {"$ref": f"#/{order[key]}", "file": key[0]} for name, key in sorted(roots.items())},
            "types": types}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repository", type=Path, help="a clone of Azure/bicep-types-az (or, with --git-dir, its .git)")
    parser.add_argument("--git-dir", action="store_true", help="the path is a bare git directory")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default {OUTPUT})")
    args = parser.parse_args(argv)
    source = Source(args.repository, bare=args.git_dir)
    found, missing = locate(source, declared_types())
    if missing:
        print(f"error: not in Azure/bicep-types-az at {source.commit}: {', '.join(missing)}", file=sys.stderr)
        return 1
    document = trimmed(source, found)
    args.output.write_text(json.dumps(document, indent=0, sort_keys=False) + "\n")
    print(f"wrote {args.output}: {len(found)} resource types, {len(document['types'])} entries, commit {source.commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
