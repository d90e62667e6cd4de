"""Aggregation throughput: the fused kernel against pure-torch implementations at the paper's tier mix.

For the EMNIST CNN, the CIFAR-10 CNN and the Shakespeare LSTM with 10, 50 and 200 clients (tiers
0.25/0.5/0.75/1.0 drawn with probabilities 0.40/0.25/0.20/0.15), times in one run, interleaved round-robin,
median of repeats after a warm-up:

    fused kernel      the op alone (layout built beforehand)
    fused             hasfl_ray.aggregate_updates(..., backend="fused"): validation + layout + op
    torch sliced      pure torch: per (parameter, tier) a contiguous sum of the tier's updates added into
                      the leading slice, one dist per (client, parameter); the best pure torch found
    torch stacked     pure torch: clients of one tier stacked, one matmul per (parameter, tier)
    torch per client  pure torch in place: add_ into the region and dist per (parameter, client)
    reference         the pure-torch reference backend (float64 sums)
    dense             every update zero-padded to the full shape with a mask
    heterofl loop     HeteroFL's combine(): meshgrid index tensors per (parameter, client)

and prints effective GB/s ((packed client bytes + output bytes) / time), how many times slower than fused
each one is, the end-to-end call over the kernel alone, the fastest pure torch ("best torch") against both,
and the bandwidth of a large torch copy (read + write) and of a large torch sum (read only, the ceiling of a
read-dominated kernel) measured in the same run, with the kernel's fraction of each.
Same options as `hasfl-ray bench aggregate`:

    python benchmarks/bench_aggregate.py                                  # all models, 10/50/200 clients, CPU
    python benchmarks/bench_aggregate.py --models emnist --clients 50 --repeats 9
    python benchmarks/bench_aggregate.py --device cuda --json
"""

from hasfl_ray.cli.bench import aggregate

if __name__ == "__main__":
    aggregate(prog_name="bench_aggregate.py")
