"""The model: providers and their settings, the built-in script model, retries of a failed
request, and what a response used and cost.

Layers, top to bottom (as in :mod:`cox_runner`):

1. Providers
   - ``providers``: the models a session can choose, their settings, windows and prices.
2. The leaves
   - ``script_model``: the built-in ``script`` model: follows a JSON script, no network.
   - ``retry``: which failed requests are worth another try, and how long to wait.
   - ``usage``: what one response used and cost (a ``usage`` event's fields).
"""
