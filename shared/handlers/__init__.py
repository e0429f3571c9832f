"""Handlers: decide what one delivery means and write it through the ports. They never settle messages."""
