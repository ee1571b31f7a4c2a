"""The daemon's command-line client: the HTTP client, the terminal tables and `top`."""
