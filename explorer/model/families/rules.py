"""How a family states the relations between config keys that a type cannot: one (ok, key, message) rule each, of
which the failing ones become the one-line problems validation reports (kept apart from base.py so that the storage
readers the base skeleton composes can use it too)."""

from __future__ import annotations


def rule_problems(rules: list[tuple[bool, str, str]]) -> list[str]:
    """Format (ok, key, message) rules as "key 'k': message" for the ones that fail."""
    return [f"key '{key}': {msg}" for ok, key, msg in rules if not ok]
