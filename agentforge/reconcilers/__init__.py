"""Reconcilers: turn observed state into actions (filled in by the capacity-bridge issue)."""
