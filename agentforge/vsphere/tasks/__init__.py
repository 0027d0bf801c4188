"""vCenter tasks: one waiter per session behind one filter, and the per-vCenter task slots."""
