"""The bottom layer every parent, the PKI and the worker share: files read and written safely
(files.py: private folders, atomic writes), the reasons a parent tells peers (reasons.py:
bounded, without its own paths) and the allocator's tuning for streaming (malloc_tuning.py).
It imports no other atoll layer, so any layer may import it."""
