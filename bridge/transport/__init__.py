"""How requests travel between bridge processes besides the request plane itself: shared
memory between a door and a worker on one host (shm_regions.py, shm_exchange.py), and the
stamp by which a worker tells a request that arrived after its caller gave up (arrival.py)."""
