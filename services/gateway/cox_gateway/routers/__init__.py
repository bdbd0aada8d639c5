"""The HTTP API (docs/api.md), one ``APIRouter`` per section: ``sessions``, ``steering``,
``versions``, ``turns``, ``runs``, ``events``, ``ops``, ``answers`` (answer links, no token). ``cox_gateway.app.create_app`` includes them."""
