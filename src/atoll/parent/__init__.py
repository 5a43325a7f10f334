"""What the server and site parents share: their entry (run.py), start detached and stop
(detach.py, pidfile.py), the forked check of local/ and its record, malloc tuning, and the
endpoint their own job workers dial."""
