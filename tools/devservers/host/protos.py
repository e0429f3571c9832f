"""The FunctionRpc messages and service, compiled from ``function_rpc.proto`` when first imported.

No wheel ships the FunctionRpc ``.proto``; grpcio-tools (a dependency of the Service Bus binding
extension) compiles ours in memory, so nothing generated is committed and the protobuf runtime and
compiler always match. The result is one module-like object, the ``protos`` that azure-functions-runtime
expects: every message class, and the stub, servicer and registration function of FunctionRpc.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import grpc

_HERE = Path(__file__).resolve().parent


def _compile() -> types.ModuleType:
    sys.path.insert(0, str(_HERE))
    try:
        messages, services = grpc.protos_and_services("function_rpc.proto")
    finally:
        sys.path.remove(str(_HERE))
    merged = types.ModuleType("function_rpc_protos")
    merged.__dict__.update({k: v for k, v in vars(messages).items() if not k.startswith("_")})
    merged.__dict__.update({k: v for k, v in vars(services).items() if not k.startswith("_")})
    return merged


protos = _compile()
