"""Discrete-event simulation in virtual time."""
