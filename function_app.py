"""The Functions app: create it and register the consumers' blueprint. Nothing else happens here.

The binding names come from the settings as the host indexes the functions; the app behind them is
built on the first invocation, once, so that nothing connects (or imports a client, or the handlers'
modules) while indexing.
The counters' export to Application Insights starts then too.
"""

import functools

import azure.functions as func

from consumers.triggers import from_environment, make_blueprint
from shared.settings import Settings

root = functools.cache(from_environment)

app = func.FunctionApp()
app.register_functions(make_blueprint(Settings.from_env(), root))
