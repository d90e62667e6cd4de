"""finite_flags: the server's one-pass finiteness check agrees with ClientResult.is_finite on every kind of value."""

import math

import pytest
import torch

from hasfl_ray.training.result import ClientResult, finite_flags


def result(generator, bad=None, where="update", dtype=torch.float32, loss=0.5):
    update = {"w": torch.randn(4, 5, generator=generator, dtype=dtype), "b": torch.randn(7, generator=generator,
                                                                                         dtype=dtype)}
    extras = {"drift": {"w": torch.randn(3, generator=generator)}, "count": 3, "label": "x",
              "steps": torch.arange(4)}
    target = update["b"] if where == "update" else extras["drift"]["w"]
    if bad == "nan":
        target[1] = math.nan
    elif bad == "inf":
        target[0] = -math.inf
    elif bad == "huge":  # finite, but its 2-norm overflows float32: the exact check must keep it
        target.fill_(3e38)
    elif bad == "float":
        extras["scale"] = math.inf
    return ClientResult(0, 1.0, update, 10, loss, 2, extras)


@pytest.mark.parametrize("seed", range(4))
def test_finite_flags_is_is_finite_of_each_result(seed):
    generator = torch.Generator().manual_seed(seed)
    kinds = [None, "nan", "inf", "huge", "float"]
    results = [result(generator, bad=kinds[int(torch.randint(5, (1,), generator=generator))],
                      where=["update", "extras"][int(torch.randint(2, (1,), generator=generator))],
                      dtype=[torch.float32, torch.float64][int(torch.randint(2, (1,), generator=generator))],
                      loss=[0.5, math.nan][int(torch.rand(1, generator=generator) < 0.1)])
               for _ in range(12)]
    assert finite_flags(results) == [r.is_finite() for r in results]


def test_finite_flags_of_clean_huge_and_empty_rounds():
    generator = torch.Generator().manual_seed(0)
    clean = [result(generator) for _ in range(5)]
    assert finite_flags(clean) == [True] * 5
    assert finite_flags([result(generator, "huge"), result(generator, "nan")]) == [True, False]
    assert finite_flags([result(generator, loss=math.inf)]) == [False]
    assert finite_flags([]) == []
