"""The worker child of the local host: a small dispatcher around the production library azure-functions-runtime.

It plays the part of the Python "proxy worker" that Azure runs from Python 3.13: it takes the host's
arguments (``--host``, ``--port``, ``--workerId``, ``--requestId``, ``--functions-grpc-max-message-length``;
the Service Bus extension reads the same argv to reach the host's Settlement service), connects to the
host's EventStream, says StartStream, and hands each message to the runtime's handler, one asyncio task
per message, as the proxy worker does. Log records become RpcLog messages, tagged with the invocation
they belong to, found as the proxy worker finds it: first on the running task (an async function runs in
its invocation's task, and tasks it starts inherit the id; the runtime sets no context variable for it),
then in the runtime's ``invocation_id_cv`` (set on the pool thread that runs a sync function).

    python -m devservers.host.worker --host 127.0.0.1 --port P --workerId W --requestId R ...
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from devservers.host.protos import protos

# The proxy worker drops the gRPC size limit of 4 MB only by accident; ours says what it means.
MAX_MESSAGE_BYTES = 2**31 - 1
_LEVELS = ((logging.CRITICAL, "Critical"), (logging.ERROR, "Error"), (logging.WARNING, "Warning"),
           (logging.INFO, "Information"))


@dataclass
class WorkerRequest:
    """What azure-functions-runtime's handlers take: the StreamingMessage and, at init, protos and host."""

    name: str
    request: Any
    properties: dict[str, Any] | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The host's argument conventions; unknown ones are ignored, as the proxy worker does."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workerId", dest="worker_id", required=True)
    parser.add_argument("--requestId", dest="request_id", required=True)
    args, _ = parser.parse_known_args(argv)
    return args


class _RpcLogHandler(logging.Handler):
    """Each log record to the host as an RpcLog, from whichever thread logs it."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self._dispatcher = dispatcher

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = next((name for number, name in _LEVELS if record.levelno >= number), "Debug")
            system = record.name.startswith(("azure_functions_runtime", "azure.functions"))
            log = protos.RpcLog(
                level=getattr(protos.RpcLog, level), message=self.format(record), category=record.name,
                log_category=protos.RpcLog.System if system else protos.RpcLog.User,
                invocation_id=self._dispatcher.invocation_id() or "",
            )
            self._dispatcher.send(protos.StreamingMessage(request_id=self._dispatcher.request_id, rpc_log=log))
        except Exception:
            self.handleError(record)


class InvocationTask(asyncio.Task[Any]):
    """A task that carries the invocation it works for, inherited from the task that creates it (the proxy
    worker's ContextEnabledTask)."""

    invocation_id: str | None = None

    def __init__(self, coro: Any, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(coro, loop=loop, **kwargs)
        self.invocation_id = getattr(asyncio.current_task(loop), "invocation_id", None)


def _invocation_task(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> InvocationTask:
    return InvocationTask(coro, loop=loop, **kwargs)


class Dispatcher:
    """The EventStream client: one task per incoming message, responses queued back to the host."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.address = f"{args.host}:{args.port}"
        self.host = args.host
        self.worker_id = args.worker_id
        self.request_id = args.request_id
        self.loop = asyncio.get_running_loop()
        self.outgoing: asyncio.Queue[Any] = asyncio.Queue()
        self.runtime: Any = None

    def send(self, message: Any) -> None:
        """Queue a message for the host; safe from any thread."""
        self.loop.call_soon_threadsafe(self.outgoing.put_nowait, message)

    def invocation_id(self) -> str | None:
        """The invocation the current task (an async function's) or thread (a sync function's) works for, if any."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a thread without a running loop: the pool's, or one the function started
            task = None
        if (found := getattr(task, "invocation_id", None)) is not None:
            return str(found)
        return self.runtime.invocation_id_cv.get() if self.runtime is not None else None

    async def _stream(self) -> AsyncIterator[Any]:
        while (message := await self.outgoing.get()) is not None:
            yield message

    async def run(self) -> None:
        """Connect, say StartStream, and serve until the host ends the stream or says WorkerTerminate."""
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(self.address, options=options) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            self.outgoing.put_nowait(protos.StreamingMessage(
                request_id=self.request_id, start_stream=protos.StartStream(worker_id=self.worker_id)))
            root = logging.getLogger()
            root.setLevel(logging.INFO)
            root.addHandler(_RpcLogHandler(self))
            # The Service Bus extension decodes with uamqp, whose C layer chatters at INFO on every message,
            # and the Azure SDKs log every HTTP request at INFO: the app's own records are what matter here.
            for noisy in ("uamqp", "azure"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
            logging.getLogger("azure.functions").setLevel(logging.INFO)
            self.loop.set_task_factory(_invocation_task)  # every task, the invocations' and theirs, an InvocationTask
            tasks: set[asyncio.Task[None]] = set()
            async for request in protos.FunctionRpcStub(channel).EventStream(self._stream()):
                task = asyncio.create_task(self._dispatch(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _dispatch(self, request: Any) -> None:
        kind = request.WhichOneof("content")
        if kind == "worker_terminate":
            if self.runtime is not None:
                await asyncio.to_thread(self.runtime.stop_threadpool_executor)  # lets running calls finish
            self.outgoing.put_nowait(None)
            return
        if kind == "worker_status_request":
            self.send(protos.StreamingMessage(request_id=request.request_id,
                                              worker_status_response=protos.WorkerStatusResponse()))
            return
        if kind == "worker_init_request":
            self._load_runtime(request.worker_init_request.function_app_directory)
        if kind == "invocation_request" and isinstance(task := asyncio.current_task(), InvocationTask):
            task.invocation_id = request.invocation_request.invocation_id  # logs of an async function find it here
        handler, response_field, echo = _HANDLERS[kind]
        properties = {"protos": protos, "host": self.host} if kind == "worker_init_request" else None
        response = await getattr(self.runtime, handler)(WorkerRequest(kind, request, properties))
        request_id = request.request_id if echo else self.request_id
        self.send(protos.StreamingMessage(request_id=request_id, **{response_field: response}))

    def _load_runtime(self, app_directory: str) -> None:
        # The runtime imports function_app by module name; the proxy worker puts the app on sys.path.
        if app_directory and app_directory not in sys.path:
            sys.path.insert(0, app_directory)
        import azure_functions_runtime  # noqa: PLC0415 - Python 3.13 only, loaded when the host asks

        self.runtime = azure_functions_runtime
        self.runtime.start_threadpool_executor()


# StreamingMessage kind -> (runtime handler, response field, whether the response echoes the request id)
_HANDLERS = {
    "worker_init_request": ("worker_init_request", "worker_init_response", False),
    "functions_metadata_request": ("functions_metadata_request", "function_metadata_response", True),
    "function_load_request": ("function_load_request", "function_load_response", False),
    "invocation_request": ("invocation_request", "invocation_response", False),
}


async def _serve(args: argparse.Namespace) -> None:
    await Dispatcher(args).run()


def main() -> None:
    """Run the dispatcher until the host lets it go."""
    os.environ.setdefault("FUNCTIONS_WORKER_RUNTIME", "python")
    asyncio.run(_serve(parse_args()))


if __name__ == "__main__":
    main()
