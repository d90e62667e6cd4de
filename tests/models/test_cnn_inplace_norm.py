"""The image CNN's BatchNorm without autograd on a CPU writes over its input (hasfl_ray/models/cnn.py, issue 46 item
3): the same bits as ``nn.BatchNorm2d`` (signed zeros included), autograd's path unchanged, and an evaluation pass
after glibc's ``malloc_trim`` faults in far fewer pages (a subprocess counts them: minor faults, not a timer)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from hasfl_ray import allocator
from hasfl_ray.engine.eval_layout import _evaluation_layout
from hasfl_ray.models import build_model, cnn


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The float32 values' bit patterns in logical (NCHW) order: -0.0 differs from 0.0 here."""
    return tensor.contiguous().view(torch.int32)


@pytest.mark.parametrize("shape", [(359, 32, 8, 8), (33, 64, 4, 4), (2, 5, 3, 3), (7, 24, 14, 14)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_without_autograd_it_writes_over_its_input_with_the_plain_norms_bits(shape, channels_last):
    generator = torch.Generator().manual_seed(shape[0])
    x = torch.randn(shape, generator=generator) * 3 + 1
    x[0, 0] = 0.0  # zeros and negative zeros through the norm
    x[-1, -1] = -0.0
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    norm = cnn.BatchNorm2d(shape[1], track_running_stats=False)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[1], generator=generator))
        norm.bias.copy_(torch.randn(shape[1], generator=generator))
        norm.bias[0] = 0.0
        want = nn.BatchNorm2d.forward(norm, x)
        given = x.clone(memory_format=torch.preserve_format)
        got = norm(given)
    assert got.data_ptr() == given.data_ptr() and got.stride() == want.stride()
    assert torch.equal(bits(got), bits(want))


def test_with_autograd_it_is_the_plain_norm():
    norm = cnn.BatchNorm2d(8, track_running_stats=False)
    x = torch.randn(4, 8, 5, 5, requires_grad=True)
    kept = x.detach().clone()
    y = norm(x)
    assert y.data_ptr() != x.data_ptr() and torch.equal(x.detach(), kept)
    y.square().sum().backward()
    plain = x.detach().clone().requires_grad_()
    nn.BatchNorm2d.forward(norm, plain).square().sum().backward()
    assert torch.equal(bits(x.grad), bits(plain.grad))


@pytest.mark.parametrize("layout", ["default", "evaluation"])
def test_the_digits_cnn_evaluates_to_the_same_logits_as_with_plain_norms(layout, monkeypatch):
    torch.manual_seed(3)
    model = build_model("digits", 0.6)
    model = _evaluation_layout(model) if layout == "evaluation" else model
    model.eval()
    x = torch.randn(359, 1, 8, 8)
    with torch.no_grad():
        got = model(x)
        monkeypatch.setattr(cnn.BatchNorm2d, "forward", nn.BatchNorm2d.forward)
        want = model(x)
    assert torch.equal(bits(got), bits(want))


FAULTS = """
import ctypes, json, resource, sys, torch
# every allocation of 64 KiB and more mmapped afresh and unmapped when freed (M_MMAP_THRESHOLD, which also stops
# glibc from raising it): each activation of a pass is faulted in whole, wherever the heap's holes happen to be
assert ctypes.CDLL(None).mallopt(-3, 65536) == 1
from torch import nn
from hasfl_ray import allocator
from hasfl_ray.data import load_dataset
from hasfl_ray.engine.eval_layout import _evaluation_layout
from hasfl_ray.models import build_model, cnn
from hasfl_ray.training.determinism import apply_determinism
from hasfl_ray.training.evaluate import evaluate
apply_determinism(True)
torch.set_num_threads(1)
dataset = load_dataset("digits", 6, 0.3, 0)
model = _evaluation_layout(build_model("digits", 1.0))

def faults():
    evaluate(model, dataset, 500)  # warm: oneDNN's primitives, the heap's size
    counts = []
    for _ in range(3):
        allocator.release()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        evaluate(model, dataset, 500)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(counts)

if sys.argv[1] == "plain":
    cnn.BatchNorm2d.forward = nn.BatchNorm2d.forward
print(json.dumps({"faults": faults(), "test_size": sum(len(y) for _, y in dataset.test_batches(500))}))
"""


@pytest.mark.skipif(not allocator.enabled(), reason="needs glibc's malloc_trim (Linux) and HASFL_MALLOC_TRIM not 0")
def test_an_evaluation_pass_after_malloc_trim_faults_in_its_norms_outputs_pages_fewer():
    """The digits CNN's full-width test pass (one batch of 359 images) just after ``malloc_trim``, in 4 KiB pages
    (huge pages off), each activation of 64 KiB and more mmapped afresh (so the count is the pass's own, not where
    the heap's holes happen to lie in that process: measured 2,080 in place against 3,160 with new norm outputs, the
    same in every process): the norms written in place fault in at least 95 % of their outputs' pages fewer,
    (32 x 8 x 8 + 64 x 4 x 4) floats x 359 images = 1,077 pages. (With glibc's own thresholds the pass's pages
    depend on where the freed blocks lie: 1,354-1,620 against 1,640-2,430, a process each.) The least of 3 passes
    each, a process each; minor faults count pages touched, whatever else the machine runs."""
    environ = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0", allocator.VARIABLE: "1"}
    counts = {}
    for norms in ("in_place", "plain"):  # a process each: the same heap before each
        out = subprocess.run([sys.executable, "-c", FAULTS, norms], capture_output=True, text=True, env=environ,
                             check=True)
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        counts[norms] = measured["faults"]
    norm_pages = (32 * 8 * 8 + 64 * 4 * 4) * measured["test_size"] * 4 // 4096
    assert counts["plain"] - counts["in_place"] >= 0.95 * norm_pages, counts


def test_a_strided_input_is_left_as_it_is():
    """Only a dense input (either layout) is written over; a view with gaps gets the plain norm's new tensor."""
    norm = cnn.BatchNorm2d(4, track_running_stats=False)
    whole = torch.randn(6, 8, 5, 5)
    x = whole[:, ::2]
    kept = whole.clone()
    with torch.no_grad():
        got = norm(x)
        want = nn.BatchNorm2d.forward(norm, x)
    assert torch.equal(whole, kept) and torch.equal(bits(got), bits(want))
