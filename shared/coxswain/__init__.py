"""coxswain's contract: the models, subjects, keys and settings every service shares.

Services import from here and nowhere else for anything that crosses a process boundary:
an HTTP body, a NATS request or reply, an event, a Redis key.
"""

__version__ = "0.1.0"
