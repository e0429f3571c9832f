"""The Functions-facing layer: triggers, binding types, and the mapping of outcomes to settlement."""
