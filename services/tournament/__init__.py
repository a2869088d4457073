"""Tournaments and matches: pairings, the event-sourced aggregate, its store and director."""
