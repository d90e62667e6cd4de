"""`hasfl-ray info` and `hasfl-ray bench aggregate`: output contracts and user errors (exit status 2)."""

import json

import pytest
import torch
from click.testing import CliRunner

from aggregation_cases import check_agreement
from hasfl_ray.cli.main import main
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import aggregate_private as private
from hasfl_ray.training.workspace import MODEL_CACHE_WEIGHTS


def test_info_json_reports_extension_versions_and_devices():
    result = CliRunner().invoke(main, ["info", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["torch"] == torch.__version__
    assert data["extension"]["built"] == ops.available()
    assert data["extension"]["cuda_kernel"] == ops.cuda_available()
    assert data["extension"]["private_cuda_kernel"] == private.cuda_available()
    assert data["devices"][0]["device"] == "cpu"
    assert len(data["devices"]) == 1 + (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert data["model_cache"].startswith(f"an LRU per trainer of at most {MODEL_CACHE_WEIGHTS}x the full-width")


def test_info_text_names_the_kernels():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0 and "CPU kernel" in result.output and "CUDA kernel" in result.output
    assert f"Model cache: an LRU per trainer of at most {MODEL_CACHE_WEIGHTS}x" in result.output


def test_bench_aggregate_json_has_every_implementation():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--models", "shakespeare", "--clients", "2",
                                       "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    (case,) = json.loads(result.output.splitlines()[-1])
    names = {t["implementation"] for t in case["timings"]}
    assert {"torch sliced", "torch stacked", "torch per client", "reference", "dense", "heterofl loop"} <= names
    if ops.available():
        assert {"fused", "fused kernel"} <= names and case["ratios"]["kernel_fraction_of_copy"] > 0
    assert case["clients"] == 2 and case["copy_gbps"] > 0 and case["packed_mb"] > 0


@pytest.mark.parametrize("args,message", [
    (["--clients", "ten"], "client counts"),
    (["--clients", "0"], "client counts"),
    (["--models", "mnist"], "mnist"),
])
def test_bench_aggregate_bad_options_exit_2(args, message):
    result = CliRunner().invoke(main, ["bench", "aggregate", *args])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_aggregate_cuda_without_gpu_exits_2():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--device", "cuda"])
    assert result.exit_code == 2 and "CUDA" in result.output


def test_benchmarked_implementations_compute_the_same_result():
    assert check_agreement("digits", num_clients=5) < 1e-10


@pytest.mark.parametrize("layout", ["index", "mask", "window", "depth"])
def test_bench_aggregate_layouts_json(layout):
    result = CliRunner().invoke(main, ["bench", "aggregate", "--models", "emnist", "--clients", "2", "--repeats", "1",
                                       "--skip-slow", "--layout", layout, "--json"])
    assert result.exit_code == 0, result.output
    (case,) = json.loads(result.output.splitlines()[-1])
    assert case["layout"] == layout and case["copy_gbps"] > 0 and case["packed_mb"] > 0
    names = {t["implementation"] for t in case["timings"]}
    if ops.available():
        assert {"fused", "fused kernel"} <= names and case["ratios"]["kernel_fraction_of_copy"] > 0
    assert case["ratios"]["best_torch"] in names


def test_bench_aggregate_window_layout_on_cuda_exits_2():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--layout", "window", "--device", "cuda"])
    assert result.exit_code == 2 and "--layout window runs on the CPU only" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_aggregate_depth_layout_on_cuda_without_gpu_exits_2():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--layout", "depth", "--device", "cuda", "--models",
                                       "emnist"])
    assert result.exit_code == 2 and "needs a visible CUDA GPU" in result.output


def test_bench_aggregate_depth_layout_of_a_model_without_exits_exits_2():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--layout", "depth", "--models", "shakespeare",
                                       "--clients", "2", "--repeats", "1"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "'shakespeare' has none; expected one of" in result.output and "emnist" in result.output


def test_bench_aggregate_depth_layout_offers_only_models_that_models_takes():
    """The sentence offered cifar100 and digits, which --models then refused (h50)."""
    from hasfl_ray.bench.aggregate import MODELS

    result = CliRunner().invoke(main, ["bench", "aggregate", "--layout", "depth", "--models", "shakespeare",
                                       "--clients", "2", "--repeats", "1"])
    offered = result.output.strip().rsplit("expected one of ", 1)[1].split(", ")
    assert result.exit_code == 2 and offered and set(offered) <= set(MODELS), result.output
    for model in offered:
        assert CliRunner().invoke(main, ["bench", "aggregate", "--layout", "depth", "--models", model,
                                         "--clients", "0"]).output.count("--models") == 0


def test_depth_layout_clients_hold_their_depths_prefix():
    """Each client's update is exactly its depth's parameters (depth from its tier's rank), full width; every
    depth occurs; the fused result (where built) and the slice competitors agree with the reference."""
    from hasfl_ray.aggregation import aggregate_updates
    from hasfl_ray.bench.layouts import depth_model, make_layout_federation
    from hasfl_ray.bench.torch_aggregations import aggregate_torch_sliced
    from hasfl_ray.data.partition import TIERS
    from hasfl_ray.models.depth import depth_names

    f = make_layout_federation("digits", 12, "depth", dtype=torch.float64)
    network = depth_model("digits")
    tiers, seen = sorted(TIERS), set()
    for width, update in zip(f.widths, f.updates):
        depth = -(-(tiers.index(width) + 1) * network.num_depths // len(tiers))
        seen.add(depth)
        assert list(update) == depth_names(network, depth)
        assert all(tuple(t.shape) == f.shapes[name] for name, t in update.items())
    assert seen == set(range(1, network.num_depths + 1))
    expected = aggregate_updates(f.shapes, f.updates, f.weights, f.gate_blocks, backend="reference")
    results = [aggregate_torch_sliced(f.shapes, f.updates, f.weights, f.gate_blocks)]
    if ops.available():
        results.append(aggregate_updates(f.shapes, f.updates, f.weights, f.gate_blocks, backend="fused"))
    for result in results:
        for name in f.shapes:
            torch.testing.assert_close(result.delta[name], expected.delta[name], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(result.div_num, expected.div_num, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(result.div_den, expected.div_den, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("layout", ["index", "mask"])
def test_layout_competitors_compute_the_same_result(layout):
    from hasfl_ray.aggregation import aggregate_updates
    from hasfl_ray.bench.layouts import make_layout_federation, torch_dense, torch_index_add

    f = make_layout_federation("digits", 4, layout, dtype=torch.float64)
    expected = aggregate_updates(f.shapes, f.updates, f.weights, f.gate_blocks, backend="reference")
    for competitor in (torch_index_add, torch_dense):
        delta, div_num, div_den = competitor(f.shapes, f.updates, f.weights, f.gate_blocks)
        for name in f.shapes:
            torch.testing.assert_close(delta[name], expected.delta[name], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(div_num, expected.div_num, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(div_den, expected.div_den, rtol=1e-9, atol=1e-9)
