"""Seeds that once broke an invariant, each named after the run that found it; they must stay green."""

from __future__ import annotations

from simulation.run import simulate


def test_seed_16523_a_stale_delivery_that_takes_a_claim_over_does_not_strand_the_reservation() -> None:
    # A delivery whose lock had run out took the claim over; the live redelivery lost the etag race,
    # completed as in_progress, and the stale one then crashed: the reservation was never made.
    report = simulate(16523)
    assert report.violations == []


def test_seed_19195_a_finish_that_loses_the_record_to_our_own_message_finishes_it_anyway() -> None:
    report = simulate(19195)
    assert report.violations == []


def test_seed_76_a_copy_that_found_its_pending_order_replaced_takes_the_claim_kept_in_the_order() -> None:
    # The claim in the order: a copy looked for the claim while a pending order stood, lost the race to take its
    # place, read the order, and claimed the reservation again as a document of its own beside the one in the order.
    report = simulate(76)
    assert report.violations == []
