"""The worker process: started with the host's arguments, asked to index the app, then to invoke functions.

Functions are learned from the worker's metadata response, never by importing the app here: the
worker indexes ``function_app`` as Azure's does, and each function's trigger comes from its
``raw_bindings``. Function ids are the worker's own (the runtime derives them from the names), so
they stay the same across worker restarts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devservers.host.channel import EventStreamService, WorkerChannel
from devservers.host.protos import protos

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # tools/, the directory that holds devservers/
MAX_MESSAGE_BYTES = 2**31 - 1
START_TIMEOUT_SECONDS = 60


class HostError(RuntimeError):
    """The host cannot go on; the message says what failed and why."""


def failure(response: Any) -> str:
    """What failed an invocation, in one line: its exception's first line (the app's errors carry ids and causes, never
    payloads), or the worker gone."""
    if response is None:
        return "the worker exited"
    message = (response.result.exception.message or "").strip().splitlines()
    return message[0][:300] if message else "no message"


@dataclass(frozen=True)
class Retry:
    """A function's retry policy (``@app.retry``; the worker's RpcRetryOptions): a failed invocation is run again
    up to ``max_retry_count`` times, ``delay_seconds(n)`` apart, before its trigger moves on."""

    max_retry_count: int
    fixed: bool  # fixed_delay; else exponential_backoff
    delay: float = 0.0  # fixed_delay's interval
    minimum: float = 0.0  # exponential_backoff's first interval, doubling up to ``maximum``
    maximum: float = 0.0

    @classmethod
    def of(cls, meta: Any) -> Retry | None:
        """The policy an RpcFunctionMetadata carries, or None."""
        if not meta.HasField("retry_options"):
            return None
        options = meta.retry_options
        fixed = options.retry_strategy == protos.RpcRetryOptions.fixed_delay
        return cls(options.max_retry_count, fixed, options.delay_interval.ToTimedelta().total_seconds(),
                   options.minimum_interval.ToTimedelta().total_seconds(),
                   options.maximum_interval.ToTimedelta().total_seconds())

    def delay_seconds(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the first)."""
        if self.fixed:
            return self.delay
        return float(min(self.maximum, self.minimum * 2 ** (retry - 1)))


@dataclass(frozen=True)
class Function:
    """One indexed function: its name, the worker's id for it, its trigger binding, and its retry policy."""

    name: str
    function_id: str
    trigger: dict[str, Any]
    retry: Retry | None = None

    @property
    def trigger_type(self) -> str:
        """serviceBusTrigger, timerTrigger, cosmosDBTrigger..."""
        return str(self.trigger.get("type"))

    @property
    def parameter(self) -> str:
        """The name of the trigger's parameter."""
        return str(self.trigger["name"])


class WorkerProcess:
    """One worker child process and its EventStream channel."""

    def __init__(self, service: EventStreamService, address: tuple[str, int], app_dir: Path,
                 environment: dict[str, str], python: str = sys.executable) -> None:
        self._service = service
        self._address = address
        self._app_dir = app_dir
        self._environment = environment
        self._python = python
        self.worker_id = str(uuid.uuid4())
        self._request_id = str(uuid.uuid4())
        self._channel: WorkerChannel | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> list[Function]:
        """Start the child, index the app, load every function; HostError if the app cannot be indexed."""
        self._channel = self._service.expect(self.worker_id)
        host, port = self._address
        argv = [self._python, "-m", "devservers.host.worker", "--host", host, "--port", str(port),
                "--workerId", self.worker_id, "--requestId", self._request_id,
                "--grpcMaxMessageLength", str(MAX_MESSAGE_BYTES), "--functions-uri", f"http://{host}:{port}/",
                "--functions-worker-id", self.worker_id, "--functions-request-id", self._request_id,
                "--functions-grpc-max-message-length", str(MAX_MESSAGE_BYTES)]
        env = {**self._environment, "AzureWebJobsScriptRoot": str(self._app_dir),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), self._environment.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(argv, cwd=self._app_dir, env=env)
        if not self._channel.started.wait(START_TIMEOUT_SECONDS):
            self.kill()
            raise HostError(f"the worker did not connect within {START_TIMEOUT_SECONDS} s (exit code "
                            f"{self._process.poll()}); is azure-functions-runtime installed for {self._python}?")
        init = self._ask("init", worker_init_request=protos.WorkerInitRequest(
            host_version="4.0.0-local", function_app_directory=str(self._app_dir), worker_directory=str(self._app_dir)))
        if init.result.status != protos.StatusResult.Success:
            self.kill()
            raise HostError(f"the worker could not index the app in {self._app_dir}: {init.result.exception.message}")
        metadata = self._ask("metadata", functions_metadata_request=protos.FunctionsMetadataRequest(
            function_app_directory=str(self._app_dir)))
        functions = []
        for meta in metadata.function_metadata_results:
            self._ask(f"load:{meta.function_id}", function_load_request=protos.FunctionLoadRequest(
                function_id=meta.function_id, metadata=meta))
            bindings = [json.loads(raw) for raw in meta.raw_bindings]
            trigger = next(b for b in bindings if str(b.get("type", "")).endswith("Trigger"))
            functions.append(Function(meta.name, meta.function_id, trigger, Retry.of(meta)))
        return functions

    def _ask(self, key: str, **content: Any) -> Any:
        message = protos.StreamingMessage(request_id=self._request_id, **content)
        assert self._channel is not None
        return self._channel.request(key, message, START_TIMEOUT_SECONDS)

    def invoke(self, function: Function, inputs: dict[str, Any], trigger_metadata: dict[str, Any],
               timeout: float | None) -> Any:
        """Invoke and wait for the InvocationResponse (TimeoutError after ``timeout``, WorkerGone)."""
        invocation_id = str(uuid.uuid4())
        request = protos.InvocationRequest(
            invocation_id=invocation_id, function_id=function.function_id,
            input_data=[protos.ParameterBinding(name=name, data=data) for name, data in inputs.items()],
            trigger_metadata=trigger_metadata,
        )
        assert self._channel is not None
        return self._channel.request(f"invocation:{invocation_id}", protos.StreamingMessage(
            request_id=self._request_id, invocation_request=request), timeout)

    def stop(self, grace: float) -> None:
        """Ask the worker to finish what runs and exit; kill it after ``grace`` seconds."""
        if self._channel is not None:
            self._channel.send(protos.StreamingMessage(request_id=self._request_id,
                                                       worker_terminate=protos.WorkerTerminate()))
            self._channel.close()
        if self._process is not None:
            try:
                self._process.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """Kill the worker at once; what it was running dies with it."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._channel is not None:
            self._channel.close()
