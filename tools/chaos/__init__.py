"""The chaos suite (``make chaos``): competing local hosts under random faults, checked from outside."""
