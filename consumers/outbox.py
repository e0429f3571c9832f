"""publish_outbox (Cosmos DB change feed) and sweep_outbox (timer): OrderAccepted messages go out."""

from __future__ import annotations

import logging

import azure.functions as func

from consumers import runtime
from shared.outbox import OutboxPublisher, PublishReport
from shared.settings import trigger_names

PUBLISH_FUNCTION = "publish_outbox"
SWEEP_FUNCTION = "sweep_outbox"

logger = logging.getLogger("idempotent_consumer.outbox")
_names = trigger_names()

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions 1.x is untyped here


def publisher() -> OutboxPublisher:
    """The publisher over the process's store and sender."""
    settings = runtime.outbox_settings()
    return OutboxPublisher(
        runtime.order_store(), runtime.sender(), dispatched_ttl_seconds=settings.dispatched_ttl_seconds
    )


def _log(function: str, report: PublishReport) -> None:
    logger.info(
        "%s dispatched=%d failed=%d skipped=%d", function, len(report.dispatched), len(report.failed), report.skipped,
        extra={"function": function, "dispatched": len(report.dispatched), "failed": len(report.failed)},
    )


@blueprint.function_name(PUBLISH_FUNCTION)
@blueprint.cosmos_db_trigger(
    arg_name="documents",
    connection="CosmosDBConnection",
    database_name=_names["database"],
    container_name=_names["container"],
    lease_container_name=_names["leases"],
    create_lease_container_if_not_exists=False,
)
def publish_outbox(documents: func.DocumentList) -> None:
    """Change feed of the orders container: send each pending outbox document, then mark it dispatched.

    A document that cannot be sent stays pending for sweep_outbox; the change feed does not retry.
    """
    _log(PUBLISH_FUNCTION, publisher().publish(doc.to_dict() for doc in documents))


@blueprint.function_name(SWEEP_FUNCTION)
@blueprint.timer_trigger(arg_name="timer", schedule=_names["schedule"], run_on_startup=False)
def sweep_outbox(timer: func.TimerRequest) -> None:
    """Publish outbox documents still pending after OUTBOX_STUCK_AFTER_SECONDS: a missed feed batch is not lost."""
    report = publisher().sweep(stuck_after_seconds=runtime.outbox_settings().stuck_after_seconds)
    _log(SWEEP_FUNCTION, report)
