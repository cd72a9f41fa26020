"""Adders: an actor's steps -> replay items (n-step transitions, unrolls), torch-free."""
