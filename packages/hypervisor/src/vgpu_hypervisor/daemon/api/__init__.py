"""The daemon's HTTP API: the app (app.py), one router per resource (routes/), who may read and
change what (auth.py), its error documents (errors.py), and the limits on what a client can make
the server hold (limits.py, connections.py, peers.py)."""
