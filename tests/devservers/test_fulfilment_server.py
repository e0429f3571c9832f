"""The local fulfilment service (devservers.fulfilment): idempotent reservations and fault injection."""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from devservers.fulfilment import FulfilmentServer, _Handler
from tests.devservers.helptext import REPO_ROOT, options_without_help, run_module, run_on_taken_port


@pytest.fixture
def server() -> Iterator[FulfilmentServer]:
    with FulfilmentServer() as running:
        yield running


def _order(order_id: str = "order-1", quantity: int = 2) -> dict[str, Any]:
    return {"orderId": order_id, "items": [{"sku": "SKU-1", "quantity": quantity}], "correlationId": "corr-1"}


def _reserve(
    server: FulfilmentServer, key: str | None, body: Any = None, timeout: float | tuple[float, float] = 5.0
) -> requests.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return requests.post(
        f"{server.url}/reservations", json=_order() if body is None else body, headers=headers, timeout=timeout
    )


def _wait_for(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_first_request_reserves_once(server: FulfilmentServer) -> None:
    response = _reserve(server, "k1")

    assert response.status_code == 201
    payload = response.json()
    assert payload["orderId"] == "order-1"
    assert payload["reservationId"].startswith("res-")
    uuid.UUID(payload["reservationId"].removeprefix("res-"))
    assert server.reservation_count() == 1
    assert server.reservations() == [{**payload, "key": "k1"}]
    assert server.keys() == ["k1"]
    [call] = server.calls("k1")
    assert (call.key, call.status, call.body) == ("k1", 201, _order())


def test_repeat_key_returns_the_stored_response(server: FulfilmentServer) -> None:
    first = _reserve(server, "k1")
    second = _reserve(server, "k1")

    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == first.json()
    assert server.reservation_count() == 1
    assert [c.status for c in server.calls("k1")] == [201, 200]


def test_concurrent_first_requests_make_one_reservation(server: FulfilmentServer) -> None:
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(_reserve(server, "k1").status_code)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)

    assert sorted(statuses) == [200] * 7 + [201]
    assert server.reservation_count() == 1


def test_missing_or_empty_key_is_rejected(server: FulfilmentServer) -> None:
    for key in (None, ""):
        response = _reserve(server, key)
        assert response.status_code == 400
        assert response.json() == {"reason": "Idempotency-Key header is required"}
    assert server.reservation_count() == 0
    assert [c.status for c in server.calls("")] == [400, 400]


def test_body_must_be_a_json_object(server: FulfilmentServer) -> None:
    assert _reserve(server, "k1", body=[1, 2]).status_code == 400
    raw = requests.post(f"{server.url}/reservations", data=b"not json", headers={"Idempotency-Key": "k1"}, timeout=5)
    assert raw.status_code == 400
    assert server.reservation_count() == 0


def test_same_key_different_body_is_422(server: FulfilmentServer) -> None:
    first = _reserve(server, "k1")
    other = _reserve(server, "k1", body=_order(quantity=3))

    assert other.status_code == 422
    assert other.json() == {"reason": "Idempotency-Key reused with a different request"}
    assert server.reservations() == [{**first.json(), "key": "k1"}]
    assert [c.status for c in server.calls("k1")] == [201, 422]


def test_fail_next_answers_the_status_then_recovers(server: FulfilmentServer) -> None:
    server.fail_next(503, count=2, reason="warehouse busy")

    statuses = [_reserve(server, "k1") for _ in range(3)]

    assert [r.status_code for r in statuses] == [503, 503, 201]
    assert statuses[0].json() == {"reason": "warehouse busy"}
    assert server.reservation_count() == 1
    assert [c.status for c in server.calls("k1")] == [503, 503, 201]


def test_faults_are_a_fifo_queue_and_reset_drops_them(server: FulfilmentServer) -> None:
    server.fail_next(429)
    server.fail_next(500)
    assert _reserve(server, "a").status_code == 429
    assert _reserve(server, "a").status_code == 500
    server.fail_next(409, count=5)
    server.reset_faults()
    assert _reserve(server, "a").status_code == 201


def test_stall_makes_the_client_time_out_but_the_reservation_is_made(server: FulfilmentServer) -> None:
    server.stall_next(1.0)

    with pytest.raises(requests.exceptions.ReadTimeout):
        _reserve(server, "k1", timeout=(2.0, 0.3))

    assert server.reservation_count() == 0  # still stalling
    assert _wait_for(lambda: server.reservation_count() == 1)
    assert [c.status for c in server.calls("k1")] == [201]
    # The caller's retry with the same key gets the reservation it never saw.
    retry = _reserve(server, "k1")
    assert retry.status_code == 200
    assert [{**retry.json(), "key": "k1"}] == server.reservations()


def test_lose_makes_the_reservation_and_drops_the_answer(server: FulfilmentServer) -> None:
    server.lose_next()

    with pytest.raises(requests.exceptions.ConnectionError):
        _reserve(server, "k1")

    assert server.reservation_count() == 1  # made before the answer was lost
    assert [c.status for c in server.calls("k1")] == [201]
    retry = _reserve(server, "k1")  # the caller's retry with the same key gets the reservation it never saw
    assert retry.status_code == 200
    assert [{**retry.json(), "key": "k1"}] == server.reservations()


def test_lose_through_the_control_endpoint(server: FulfilmentServer) -> None:
    control = f"{server.url}/_control"
    assert requests.post(control, json={"lose": {"count": 1}}, timeout=5).ok
    assert requests.post(control, json={"lose": 3}, timeout=5).status_code == 400
    with pytest.raises(requests.exceptions.ConnectionError):
        _reserve(server, "k9")
    assert server.reservation_count() == 1 and server.pending_faults() == 0


def test_ietf_mode_answers_409_to_a_request_under_a_key_another_still_holds() -> None:
    with FulfilmentServer(ietf=True) as server:
        server.stall_next(1.0)
        first: list[requests.Response] = []
        caller = threading.Thread(target=lambda: first.append(_reserve(server, "k1")), daemon=True)
        caller.start()
        assert _wait_for(lambda: server.pending_faults() == 0)  # the first request holds the key, stalled
        busy = _reserve(server, "k1")
        assert busy.status_code == 409 and "still being processed" in busy.json()["reason"]
        other = _reserve(server, "k2")  # another key is not held up
        caller.join(timeout=5)
        assert (first[0].status_code, other.status_code) == (201, 201)
        assert _reserve(server, "k1").status_code == 200  # answered: the key is free again
        assert [c.status for c in server.calls("k1")] == [409, 201, 200]
        assert server.reservation_count() == 2


def test_without_ietf_mode_a_request_under_a_key_in_flight_is_not_refused(server: FulfilmentServer) -> None:
    server.stall_next(1.0)
    first: list[requests.Response] = []
    caller = threading.Thread(target=lambda: first.append(_reserve(server, "k1")), daemon=True)
    caller.start()
    assert _wait_for(lambda: server.pending_faults() == 0)
    assert _reserve(server, "k1").status_code == 201  # it reserves; the stalled one then repeats it
    caller.join(timeout=5)
    assert first[0].status_code == 200 and server.reservation_count() == 1


def test_a_forgotten_key_reserves_again_and_both_reservations_are_counted() -> None:
    with FulfilmentServer(forget_keys_after=0.5) as server:
        first = _reserve(server, "k1")
        assert _reserve(server, "k1").status_code == 200  # remembered
        time.sleep(0.6)
        again = _reserve(server, "k1")
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.json()["reservationId"] != first.json()["reservationId"]
        assert [r["reservationId"] for r in server.reservations()] == [first.json()["reservationId"],
                                                                        again.json()["reservationId"]]
        assert (server.reservation_count(), server.forgotten_keys()) == (2, 1)


def test_a_new_reservation_takes_its_processing_time_holding_its_key_and_a_repeat_none() -> None:
    with FulfilmentServer(ietf=True, processing_seconds=(1.0, 1.0)) as server:
        first: list[requests.Response] = []
        caller = threading.Thread(target=lambda: first.append(_reserve(server, "k1")), daemon=True)
        caller.start()
        time.sleep(0.3)  # well inside the first request's second of processing
        assert _reserve(server, "k1").status_code == 409
        caller.join(timeout=5)
        assert first[0].status_code == 201
        server.processing_seconds = (30.0, 30.0)
        assert _reserve(server, "k1", timeout=5).status_code == 200  # answered from the stored reply, not processed


def test_bad_behaviour_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="forget_keys_after"):
        FulfilmentServer(forget_keys_after=0)
    with pytest.raises(ValueError, match="processing_seconds"):
        FulfilmentServer(processing_seconds=(2.0, 1.0))


def test_stop_interrupts_a_stall() -> None:
    server = FulfilmentServer().start()
    server.stall_next(30)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _reserve(server, "k1", timeout=10)
        except requests.RequestException as err:
            errors.append(err)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert _wait_for(lambda: server.pending_faults() == 0)  # the request has taken the stall
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2
    caller.join(timeout=5)
    assert not caller.is_alive()
    assert errors  # the connection was closed without an answer
    assert server.reservation_count() == 0


def test_every_answer_closes_its_connection_and_the_client_reconnects(server: FulfilmentServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=5)
    try:
        for expected in (201, 200):
            connection.request(
                "POST",
                "/reservations",
                body=json.dumps(_order()),
                headers={"Idempotency-Key": "k1", "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            assert response.status == expected
            assert response.getheader("Connection") == "close"
            assert json.loads(response.read())["orderId"] == "order-1"
    finally:
        connection.close()


def test_answers_with_nagle_off(server: FulfilmentServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers and body leave in two writes: with Nagle on, the body would wait for the client's delayed ACK."""
    nodelay: list[int] = []
    handle = _Handler.handle

    def spy(handler: _Handler) -> None:
        nodelay.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        handle(handler)

    monkeypatch.setattr(_Handler, "handle", spy)

    assert _reserve(server, "k1").status_code == 201
    assert nodelay and all(nodelay)


def test_control_and_calls_endpoints(server: FulfilmentServer) -> None:
    control = f"{server.url}/_control"
    assert requests.post(control, json={"fail": {"status": 500, "count": 1, "reason": "boom"}}, timeout=5).ok
    first = _reserve(server, "k1")
    assert (first.status_code, first.json()) == (500, {"reason": "boom"})

    assert requests.post(control, json={"fail": {"status": 503, "count": 3}}, timeout=5).ok
    assert requests.post(control, json={"reset": True}, timeout=5).ok
    assert _reserve(server, "k1").status_code == 201

    assert requests.post(control, json={"stall": {"seconds": 0.2, "count": 1}}, timeout=5).ok
    started = time.monotonic()
    assert _reserve(server, "k2").status_code == 201
    assert time.monotonic() - started >= 0.2

    assert requests.post(control, json={"bogus": 1}, timeout=5).status_code == 400
    assert requests.post(control, json={"fail": {"status": "x"}}, timeout=5).status_code == 400

    calls = requests.get(f"{server.url}/_calls", timeout=5).json()
    assert [c["status"] for c in calls["k1"]] == [500, 201]
    assert calls["k2"][0]["body"] == _order()

    assert requests.post(control, json={"clear": True}, timeout=5).ok
    assert requests.get(f"{server.url}/_calls", timeout=5).json() == {}
    assert server.reservation_count() == 0


def test_unknown_route_is_404(server: FulfilmentServer) -> None:
    assert requests.get(f"{server.url}/nope", timeout=5).status_code == 404
    assert requests.post(f"{server.url}/nope", json={}, timeout=5).status_code == 404


def test_rejects_non_loopback_host() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FulfilmentServer(host="0.0.0.0")


def test_cli_prints_ready_line_and_serves_until_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "devservers.fulfilment", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        assert ready, "no ready line within 10 s"
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.removeprefix("listening on ").strip()

        response = requests.post(f"{url}/reservations", json=_order(), headers={"Idempotency-Key": "cli"}, timeout=5)
        assert response.status_code == 201
        assert requests.get(f"{url}/_calls", timeout=5).json()["cli"][0]["status"] == 201

        process.terminate()
        assert process.wait(timeout=5) == 0
        assert process.stdout.read() == ""  # exactly one line
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cli_verbose_logs_one_line_per_request_and_never_a_body() -> None:
    process = subprocess.Popen([sys.executable, "-m", "devservers.fulfilment", "--port", "0", "--verbose"],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        assert ready, "no ready line within 10 s"
        url = process.stdout.readline().removeprefix("listening on ").strip()
        body = {**_order("secret-order"), "note": "payload-text"}
        assert requests.post(f"{url}/reservations", json=body, headers={"Idempotency-Key": "k-1"},
                             timeout=5).status_code == 201
        assert requests.post(f"{url}/reservations", json=body, timeout=5).status_code == 400
        assert requests.get(f"{url}/nope", timeout=5).status_code == 404
        process.terminate()
        _, stderr = process.communicate(timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    requests_logged = [line.split("devservers.fulfilment.requests: ", 1)[1] for line in stderr.splitlines()
                       if "devservers.fulfilment.requests: " in line]
    assert requests_logged == ["POST /reservations 201 key=k-1", "POST /reservations 400", "GET /nope 404"]
    assert "payload-text" not in stderr and "secret-order" not in stderr


def test_cli_names_a_port_in_use_in_one_line() -> None:
    port, result = run_on_taken_port("devservers.fulfilment")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: port {port} on 127.0.0.1 is in use (another fulfilment stand-in, or make "
                             "run?); stop that, or choose another --port (0 = any free)\n")


def test_cli_help_has_help_for_every_option_and_an_example() -> None:
    result = run_module("devservers.fulfilment", "--help")
    assert result.returncode == 0 and "example:\n  python -m devservers.fulfilment --port" in result.stdout
    assert options_without_help(result.stdout) == []
    bad = run_module("devservers.fulfilment", "--port", "-1")
    assert bad.returncode == 2 and "-1 is not a port" in bad.stderr
    assert "--ietf --forget-keys-after" in result.stdout
    negative = run_module("devservers.fulfilment", "--forget-keys-after", "-5")
    assert negative.returncode == 2 and "-5 is negative" in negative.stderr


def test_an_outage_answers_503_to_every_reservation_for_its_time_records_them_and_reserves_nothing(
    server: FulfilmentServer,
) -> None:
    server.fail_next(500)  # queued faults wait for the outage's end
    server.outage(1.0)
    assert [_reserve(server, "k-out").status_code for _ in range(3)] == [503, 503, 503]
    assert server.reservation_count() == 0 and [c.status for c in server.calls("k-out")] == [503, 503, 503]
    time.sleep(1.1)
    assert [_reserve(server, "k-out").status_code for _ in range(2)] == [500, 201]
    assert server.reservation_count() == 1


def test_an_outage_is_controlled_from_outside_and_ended_at_once(server: FulfilmentServer) -> None:
    requests.post(f"{server.url}/_control", json={"outage": {"seconds": 60, "status": 502}}, timeout=5)
    assert _reserve(server, "k-ctl").status_code == 502
    requests.post(f"{server.url}/_control", json={"outage": {"seconds": 0}}, timeout=5)
    assert _reserve(server, "k-ctl").status_code == 201
