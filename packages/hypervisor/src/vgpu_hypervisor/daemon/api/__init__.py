"""The daemon's HTTP API: the app (app.py), one router per resource (routes/), its error
documents (errors.py), and the limits on what a client can make the server hold (limits.py)."""
