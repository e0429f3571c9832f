"""The docs' tables and the local settings sample agree with the code they describe, and the docs hold
together: the README stays short, indexes every page, and every relative link reaches its file and heading."""

from __future__ import annotations

import json
import re
from pathlib import Path

from idempotent_consumer.delivery import SETTLEMENTS
from idempotent_consumer.outcomes import Outcome
from shared.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"  # the Outcomes and Settings tables
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250
HOST_SETTINGS = {"CosmosDBConnection"}  # read by the Functions host only, not by our code

FENCED = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def section(page: Path, heading: str) -> str:
    """The text of ``## heading`` in ``page``, up to the next ``## `` heading."""
    text = page.read_text()
    marker = f"\n## {heading}\n"
    assert text.count(marker) == 1, f"{page.relative_to(ROOT)} should have one '## {heading}'"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def table_after(page: Path, heading: str) -> list[list[str]]:
    """The body rows of the table in ``page``'s ``## heading`` section, as stripped cells."""
    rows = [line for line in section(page, heading).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def prose(page: Path) -> str:
    """The page without its code: fenced blocks and inline code spans removed."""
    return INLINE_CODE.sub("", FENCED.sub("", page.read_text()))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page``, repeated headings numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCED.sub("", page.read_text()).splitlines():
        if match := re.match(r"#{1,6} +(.*?) *#* *$", line):
            base = slug(match.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def test_settings_table_lists_exactly_the_settings_the_code_reads() -> None:
    names = {re.sub(r"`", "", row[0]) for row in table_after(OPERATIONS, "Settings")}
    assert names - HOST_SETTINGS == set(SETTINGS)


def test_settings_table_is_the_declarations() -> None:
    rows = {re.sub(r"`", "", row[0]): row for row in table_after(OPERATIONS, "Settings")}
    for spec in SETTINGS.values():
        expected = f"`{spec.default_text}`" if spec.default is not None else spec.default_text
        assert rows[spec.name][1] == expected, spec.name
        assert rows[spec.name][2] == spec.description, spec.name


def test_local_settings_sample_names_every_setting() -> None:
    values = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    missing = set(SETTINGS) - set(values)
    assert not missing
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert "UseDevelopmentEmulator=true" in values["ServiceBusConnection"]


def test_outcomes_table_matches_the_settlement_mapping() -> None:
    rows = {row[0].strip("`"): row for row in table_after(OPERATIONS, "Outcomes")}
    assert set(rows) == {o.value for o in Outcome}
    for outcome, settlement in SETTLEMENTS.items():
        row = rows[outcome.value]
        assert row[1] == settlement.action.value.replace("deadletter", "dead-letter"), outcome
        if settlement.reason:
            assert row[2] == f"`{settlement.reason}`", outcome


def test_host_json_disables_auto_complete() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    service_bus = host["extensions"]["serviceBus"]
    assert service_bus["autoCompleteMessages"] is False
    assert {"maxConcurrentCalls", "maxAutoLockRenewalDuration"} <= set(service_bus)
    assert host["extensionBundle"]["version"] == "[4.*, 5.0.0)"


def test_the_readme_is_at_most_250_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_indexes_every_docs_page() -> None:
    linked = {(ROOT / target).resolve() for target in LINK.findall(prose(README))}
    missing = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not missing, f"README.md links no docs page {missing}"


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    broken: list[str] = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if SCHEME.match(target):
                continue  # https:, mailto: and the like
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not file.exists():
                broken.append(f"{where} no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} no such heading")
    assert not broken, "\n".join(broken)


def test_the_consumer_pages_settings_table_is_the_librarys_declarations() -> None:
    from idempotent_consumer.settings import CONSUMER  # noqa: PLC0415 - the library's, apart from the app's

    rows = {re.sub(r"`", "", row[0]): row for row in table_after(DOCS / "consumer.md", "Settings reference")}
    assert set(rows) == set(CONSUMER.specs)
    for spec in CONSUMER.specs.values():
        expected = f"`{spec.default_text}`" if spec.default is not None else spec.default_text
        assert rows[spec.name][1:] == [expected, spec.description], spec.name


def test_the_consumer_pages_outcomes_are_the_settlement_mapping() -> None:
    for row in table_after(DOCS / "consumer.md", "Errors and what each settles as"):
        for outcome in re.findall(r"`([a-z_]+)`", row[0]):
            settlement = SETTLEMENTS[Outcome(outcome)]
            if settlement.reason is not None:
                assert f"`{settlement.reason}`" in row[1], outcome
            assert settlement.action.value.replace("deadletter", "dead-letter") in row[1] or "tried again" in row[1]


def test_the_consumer_page_shows_the_example_as_it_is() -> None:
    shown = section(DOCS / "consumer.md", "Getting started").split("```python\n", 1)[1].split("```", 1)[0]
    assert shown in (ROOT / "examples" / "payments" / "function_app.py").read_text()
