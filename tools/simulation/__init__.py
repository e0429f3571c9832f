"""A deterministic simulator of the core: seeded runs of competing consumers over the in-memory fakes.

``python -m simulation --seeds N`` runs seeds 0..N-1 and checks the invariants after each;
``python -m simulation --seed S --trace`` replays one run step by step.
"""
