"""A plug-in client selection: each round invites the next k clients in id order, round-robin, instead of the seeded
uniform draw (the default of ``Algorithm.select``); widths and everything else are the base algorithm's (p^max).

    hasfl-ray simulate --algorithm examples/round_robin_selection.py:RoundRobin
"""

from hasfl_ray import Algorithm


class RoundRobin(Algorithm):
    """Round t invites clients t k, ..., t k + k − 1 (mod the number available): every client once per n / k rounds."""

    def select(self, round, available, k):
        start = round * k
        return [available[(start + j) % len(available)] for j in range(k)]
