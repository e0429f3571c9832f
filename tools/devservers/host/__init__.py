"""A local Functions host for this app: the FunctionRpc host side, over the production worker library.

Not deployed. ``python -m devservers.host`` runs an app's functions against real queues and
databases, as ``func start`` does, without Core Tools or Docker: see the README's "Local host".
"""
