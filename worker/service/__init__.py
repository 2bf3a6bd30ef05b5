"""The worker process: an RQ worker that keeps engines resident and streams tokens into Redis
(worker.py), answers token-count requests (tokenize.py) and exports Prometheus metrics."""
