"""`minisgl bench`: the standard offline and online workloads, real model shapes, JSON results."""
