"""The host's side of the FunctionRpc EventStream: one WorkerChannel per worker process.

The worker connects (it is the gRPC client), says StartStream with its worker id, and from then on
the host sends requests and waits for the matching responses: init and metadata by kind, a load by
function id, an invocation by invocation id. RpcLog messages go to the host's log. When the stream
ends (the worker exited or was killed), everything still waiting fails with ``WorkerGone``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import grpc

from devservers.host.protos import protos

logger = logging.getLogger("devservers.host")
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR,
               5: logging.CRITICAL}


class WorkerGone(RuntimeError):
    """The worker's stream ended while a response was awaited."""


class WorkerChannel:
    """Requests to one worker process and the responses it owes."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.started = threading.Event()
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self._waiting: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        self._gone = False

    def request(self, key: str, message: Any, timeout: float | None) -> Any:
        """Send ``message`` and return the response filed under ``key`` (TimeoutError, WorkerGone)."""
        future: Future[Any] = Future()
        with self._lock:
            if self._gone:
                raise WorkerGone(f"worker {self.worker_id} is gone")
            self._waiting[key] = future
        self._outgoing.put(message)
        try:
            return future.result(timeout)
        finally:
            with self._lock:
                self._waiting.pop(key, None)

    def send(self, message: Any) -> None:
        """Send without waiting for an answer."""
        self._outgoing.put(message)

    def close(self) -> None:
        """End the host's half of the stream."""
        self._outgoing.put(None)

    def outgoing(self) -> Iterator[Any]:
        """What the host sends, until ``close``."""
        while (message := self._outgoing.get()) is not None:
            yield message

    def receive(self, incoming: Iterator[Any]) -> None:
        """File each response from the worker under its key; log its RpcLogs; fail the rest at the end."""
        try:
            for message in incoming:
                self._file(message)
        except grpc.RpcError:
            pass  # the worker went away mid-stream
        finally:
            with self._lock:
                self._gone = True
                waiting = list(self._waiting.values())
            for future in waiting:
                if not future.done():
                    future.set_exception(WorkerGone(f"worker {self.worker_id} is gone"))
            self._outgoing.put(None)

    def _file(self, message: Any) -> None:
        kind = message.WhichOneof("content")
        if kind == "rpc_log":
            _log(message.rpc_log)
            return
        body = getattr(message, kind)
        key = {"worker_init_response": "init", "function_metadata_response": "metadata",
               "worker_status_response": f"status:{message.request_id}",
               "function_load_response": f"load:{getattr(body, 'function_id', '')}",
               "invocation_response": f"invocation:{getattr(body, 'invocation_id', '')}"}.get(kind)
        with self._lock:
            future = self._waiting.get(key or "")
        if future is not None and not future.done():
            future.set_result(body)


def _log(log: Any) -> None:
    invocation = f" [{log.invocation_id[:8]}]" if log.invocation_id else ""
    logger.log(_LOG_LEVELS.get(log.level, logging.INFO), "worker%s %s: %s", invocation, log.category, log.message)


class EventStreamService(protos.FunctionRpcServicer):  # type: ignore[misc,name-defined]
    """The FunctionRpc service: each worker's stream is handed to the channel registered for its id."""

    def __init__(self) -> None:
        self._channels: dict[str, WorkerChannel] = {}
        self._lock = threading.Lock()

    def expect(self, worker_id: str) -> WorkerChannel:
        """Register the channel for a worker about to start."""
        channel = WorkerChannel(worker_id)
        with self._lock:
            self._channels[worker_id] = channel
        return channel

    def EventStream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """Read StartStream, then serve the worker's channel both ways."""
        first = next(request_iterator)
        worker_id = first.start_stream.worker_id
        with self._lock:
            channel = self._channels.get(worker_id)
        if channel is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {worker_id!r} is expected")
            return
        threading.Thread(target=channel.receive, args=(request_iterator,), name=f"worker-{worker_id[:8]}-in",
                         daemon=True).start()
        channel.started.set()
        yield from channel.outgoing()
