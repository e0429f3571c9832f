"""The runtime's known risk, pinned so that a change cannot pass unnoticed: the Service Bus binding extension is a
beta that depends on uamqp, archived and without Python 3.14 wheels, so Python 3.14 is blocked
(docs/deploy.md, "Runtime risks"). When either fact changes, these tests fail with what to re-read."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import deps

EXTENSION = "azurefunctions-extensions-bindings-servicebus"
WHAT_TO_DO = ("The Service Bus binding extension's dependencies changed, so the Python 3.14 block may have moved: "
              "re-read docs/deploy.md, 'Runtime risks' (what to watch, what moving takes), update it, then this test.")


def _pins() -> dict[str, deps.Pin]:
    return {pin.name: pin for pin in deps.read_lock(deps.LOCK.read_text()) if pin.applies("3.13")}


def test_the_extension_is_the_beta_the_docs_name() -> None:
    assert _pins()[EXTENSION].version == "1.0.0b2", WHAT_TO_DO
    assert metadata.version(EXTENSION) == "1.0.0b2", WHAT_TO_DO


def test_the_extension_still_depends_on_uamqp_which_blocks_python_314() -> None:
    requires = {canonicalize_name(Requirement(r).name) for r in metadata.requires(EXTENSION) or []
                if "extra ==" not in r}
    assert requires == {"azurefunctions-extensions-base", "azure-servicebus", "uamqp", "protobuf", "grpcio",
                        "grpcio-tools"}, WHAT_TO_DO
    uamqp = _pins()["uamqp"]
    assert uamqp.version == "1.6.11" and EXTENSION in uamqp.via, WHAT_TO_DO
