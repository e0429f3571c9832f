"""The Functions app: create it and register the consumers' blueprints. Nothing else happens here."""

import azure.functions as func

from consumers.events import blueprint as events_blueprint
from consumers.orders import blueprint as orders_blueprint
from consumers.outbox import blueprint as outbox_blueprint

app = func.FunctionApp()
app.register_functions(orders_blueprint)
app.register_functions(events_blueprint)
app.register_functions(outbox_blueprint)
