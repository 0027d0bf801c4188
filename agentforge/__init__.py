"""agent-forge: supply vSphere VM capacity for HyperShift Agent-platform NodePools."""

__version__ = "0.1.0"
