"""The world around the operator on one machine: control plane, vSphere simulator, actors.

Shared by the test suites, `make demo` and `bench/`. Never imported by `agentforge`.
"""
