"""Conversation stores: where conversations persist between runs and processes."""
