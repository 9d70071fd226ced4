"""How tensor bytes travel between bridge processes besides the request plane itself: shared
memory between a door and a worker on one host (shm_regions.py, shm_exchange.py)."""
