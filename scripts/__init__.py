"""Helpers run by the Makefile (`python -m scripts.<name>`); not part of the operator."""
