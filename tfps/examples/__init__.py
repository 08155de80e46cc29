"""Experiments that ship with tfps, written as a user's would be."""
