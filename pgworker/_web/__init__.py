"""`pgworker serve`: the HTTP API (api.py) and the web dashboard (dashboard.py) of one ASGI
application (app.py). Needs the `web` extra; nothing outside this package imports it."""
