"""Algorithms defined outside services/: they run through the services by their builder alone."""
