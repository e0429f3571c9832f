"""The Functions app: create it and register the consumers' blueprint. Nothing else happens here."""

import azure.functions as func

from consumers.triggers import blueprint

app = func.FunctionApp()
app.register_functions(blueprint)
