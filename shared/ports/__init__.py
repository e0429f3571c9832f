"""Ports: the small interfaces the handlers need from the outside world (store, sender, fulfilment)."""
