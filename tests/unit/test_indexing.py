"""What the host's indexing loads: the functions' registration and nothing of the runtime behind them.

``import function_app`` is the cold start's first part (docs/performance.md): the host indexes the functions
before the first invocation. The handlers, the ports, the delivery policy, the settlement and the telemetry load
with the app, on the first invocation (``function_app.root()``), where the clients load too.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The modules the first invocation loads, and indexing does not.
RUNTIME_MODULES = ("shared.bootstrap", "shared.handlers.place_order", "shared.handlers.apply_event",
                   "idempotent_consumer.runtime", "idempotent_consumer.delivery", "idempotent_consumer.telemetry",
                   "idempotent_consumer.functions.settlement", "idempotent_consumer.functions.binding",
                   "opentelemetry.metrics")

_PROBE = f"""
import json, sys
import function_app
indexed = [m for m in {RUNTIME_MODULES!r} if m in sys.modules]
names = sorted(f.get_function_name() for f in function_app.app.get_functions())
function_app.root()
import idempotent_consumer.functions.binding, idempotent_consumer.functions.settlement  # what the trigger loads
first = [m for m in {RUNTIME_MODULES!r} if m not in sys.modules]
print(json.dumps([indexed, names, first]))
"""


def test_indexing_registers_the_five_functions_and_loads_none_of_the_runtime_behind_them() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    indexed, names, first = json.loads(out.stdout.strip().splitlines()[-1])
    assert indexed == [], f"loaded while the host indexes: {indexed}"
    assert names == ["process_order", "process_order_event", "publish_outbox", "report_stuck", "sweep_outbox"]
    assert first == [], f"not loaded by the first invocation: {first}"
