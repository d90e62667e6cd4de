"""FedGMR's stand-in rules (issue 44 item 2). The authors' code could not be read here: the stored copy of
github.com/shenhao66666/FedGMR (commits 8206b83f22cf0bfba1880a348a0fe45a8c24f615,
60cef1c6af4b079bb886870ac85e9ec219702f2b)
holds a 16-character README and an unrelated MoE-LSTM project, and the paper (arXiv 2512.05372v1) was reachable as
its abstract only. So these tests check the properties the abstract states ("progressively increases each client's
sub-model density", "mask-aware aggregation") and the stand-ins' own definitions, against float64 dense references
written here; none transcribes a source, and hasfl_ray says so (``fedgmr.SOURCE_STATUS``).
"""

import pytest
import torch

from hasfl_ray.algorithms.league import fedgmr
from hasfl_ray.errors import ConfigError


def test_the_module_says_its_rules_are_stand_ins():
    assert fedgmr.SOURCE_STATUS.startswith("stand-in")
    assert "NOT transcribed" in fedgmr.__doc__


def test_density_grows_stepwise_from_the_capacity_to_the_full_model():
    options = fedgmr.FedGMROptions(fedgmr_restore_rounds=100, fedgmr_restore_every=10)
    seen = [fedgmr.density(t, 0.25, options) for t in range(0, 130)]
    assert seen[0] == 0.25 and seen[9] == 0.25 and seen[10] == pytest.approx(0.25 + 0.75 * 0.1)
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert seen[100] == 1.0 and seen[129] == 1.0
    assert len(set(seen)) == 11  # one value per step
    assert fedgmr.density(50, 1.0, options) == 1.0  # a full client stays full


def test_restoration_only_adds_the_most_important_coordinates():
    torch.manual_seed(0)
    scores = torch.rand(8, 5)
    mask = torch.zeros(8, 5, dtype=torch.bool)
    mask[0, :] = True  # 5 of 40 held, whatever their scores
    grown = fedgmr.restore_mask(mask, scores, 0.5)
    assert int(grown.sum()) == 20 and bool((grown | mask).eq(grown).all())
    added = grown & ~mask
    outside = scores[~mask]
    threshold = torch.sort(outside, descending=True).values[14]
    assert torch.equal(added, (scores >= threshold) & ~mask)
    again = fedgmr.restore_mask(grown, scores, 0.3)  # a lower density never shrinks the mask
    assert torch.equal(again, grown)


def test_mask_aware_aggregation_is_the_holders_weighted_mean_of_the_updates():
    torch.manual_seed(1)
    glob = {"w": torch.randn(4, 3)}
    deltas = [{"w": torch.randn(4, 3)} for _ in range(3)]
    masks = [{"w": torch.rand(4, 3) > 0.5} for _ in range(3)]
    masks[0]["w"][0, 0] = masks[1]["w"][0, 0] = masks[2]["w"][0, 0] = False
    weights = [10.0, 20.0 * 0.5, 5.0]  # n_i times a staleness factor
    got = fedgmr.aggregate(glob, deltas, masks, weights, server_lr=0.8)["w"]
    for r in range(4):
        for c in range(3):
            num = sum(w * float(d["w"][r, c]) for d, m, w in zip(deltas, masks, weights) if m["w"][r, c])
            den = sum(w for m, w in zip(masks, weights) if m["w"][r, c])
            step = num / den if den else 0.0
            assert float(got[r, c]) == pytest.approx(float(glob["w"][r, c]) + 0.8 * step, rel=1e-12, abs=1e-12)
    assert float(got[0, 0]) == float(glob["w"][0, 0])


def test_a_mask_of_the_wrong_shape_or_dtype_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match=r"the mask of w has shape \(2, 3\); expected \(4, 3\)"):
        fedgmr.aggregate({"w": torch.zeros(4, 3)}, [{"w": torch.zeros(4, 3)}], [{"w": torch.ones(2, 3, dtype=bool)}],
                         [1.0])
    with pytest.raises(ConfigError, match="the mask of w has dtype torch.float32; expected torch.bool"):
        fedgmr.restore_mask(torch.ones(4, 3), torch.rand(4, 3), 0.5, name="w")


@pytest.mark.parametrize("kwargs, words", [
    ({"fedgmr_final_density": 0.0}, "fedgmr_final_density is 0.0; expected a density in (0, 1]"),
    ({"fedgmr_restore_rounds": 0}, "fedgmr_restore_rounds is 0; expected a whole number of rounds >= 1"),
    ({"fedgmr_restore_every": 20, "fedgmr_restore_rounds": 10},
     "fedgmr_restore_every is 20; expected at most fedgmr_restore_rounds (10), or no step would restore"),
])
def test_options_out_of_range_are_refused_in_one_sentence(kwargs, words):
    with pytest.raises(ConfigError) as caught:
        fedgmr.FedGMROptions(**kwargs)
    assert str(caught.value) == words
