"""bench.first_message's smoke run: one telemetry-on host, no warm-up; no timing is asserted."""

from __future__ import annotations

from bench import first_message


def test_a_telemetry_on_host_settles_the_waiting_order_and_its_exporter_sends_on_stop() -> None:
    figures = first_message.measure(1, modes=("on",), warm_up=0)
    assert figures["on_s"] > 0 and len(figures["on_runs_s"]) == 1
    assert figures["on_export_requests"] >= 1
