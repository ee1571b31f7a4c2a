"""One router per resource; each is made from the ApiContext by its ``router()``."""
