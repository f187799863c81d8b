"""Drivers: one module per wire protocol, translating threadline's messages at the edge."""
