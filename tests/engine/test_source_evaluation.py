"""Evaluation without a statistics pass, as FedRolex and FIARSE compute it (issue 43 item 2), checked against their
code written out here:

- FedRolex (AIoT-MLSys-Lab/FedRolex at 8135109): ``main_resnet.py::test`` asks every client's
  ``resnet_client.py::test_model_for_user``, which runs the global model (``resnet18(track=False)``:
  ``nn.BatchNorm2d(momentum=None, track_running_stats=False)``, so in eval mode each batch's own statistics) over
  ``make_data_loader({'test': SplitDataset(dataset, data_split[m])})['test']``: client m's own test shard, unshuffled,
  in batches of ``cfg['batch_size']['test']``, its logits outside ``label_split[m]`` set to 0 (``models/resnet.py``:
  ``out.masked_fill(label_mask == 0, 0)``), accuracy appended with weight ``input_size``. ``data_split[m]`` is
  ``data.py::non_iid``'s: one shard per label of ``label_split[m]`` (ascending), each in index order.
- FIARSE (HarliWu/FIARSE at 281519c): ``fiarse/utils.py::check_accuracy`` over the server's test loader
  (``data/data_utils.py::_ServerLoader.get_loader``: ``DataLoader(.., batch_size=--bsz 20, shuffle=False)``), the
  model in eval mode with ``fiarse/model/model_utils.py::MaskedBatchNorm_no_tracking`` norms
  (``track_running_stats=False``): each test batch's own statistics; correct / total.

Before issue 43 hasfl-ray's ``test_batch`` local accuracy ran batches over the sorted union of every client's shard,
so a batch's statistics mixed clients: on the one-round run below (batch 100) 0.705 masked / 0.513 unmasked against
FedRolex's 0.733 / 0.379.
"""

import numpy as np
import pytest
import torch
from torch import nn

from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.server import Server
from hasfl_ray.evaluation import weighted_mean
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.resnet import StaticBatchNorm2d


def untracked(model):
    """``model`` with the sources' untracked norms: nn.BatchNorm2d(momentum=None, track_running_stats=False)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, StaticBatchNorm2d):
                norm = nn.BatchNorm2d(child.num_features, momentum=None, track_running_stats=False)
                norm.load_state_dict(child.state_dict(), strict=False)
                setattr(module, name, norm)
    return model


def fedrolex_local(model, dataset, batch_size):
    """FedRolex's local accuracy, written out: per client m, data_split[m] (its shard of each label, labels
    ascending, each in index order) in unshuffled batches of ``batch_size``; masked and unmasked correct counts,
    summed over clients (logger.append(.., input_size)) and divided by the samples."""
    test_y = dataset.test_y
    masked = unmasked = total = 0
    model.eval()
    with torch.no_grad():
        for shard, labels in zip(dataset.client_test_indices, dataset.label_split):
            data_split = torch.cat([shard[test_y[shard] == label] for label in labels])  # non_iid's extend order
            starts = list(range(0, len(data_split), batch_size))
            if len(data_split) % batch_size == 1 and len(starts) > 1:
                starts.pop()  # (hasfl-ray: a last batch of one sample joins the one before; FedRolex's never has one)
            for start, end in zip(starts, starts[1:] + [len(data_split)]):
                batch = data_split[start:end]
                x, y = next(iter(dataset.test_subset_batches(batch, len(batch))))
                out = model(x)
                label_mask = torch.zeros(out.shape[1])
                label_mask[torch.as_tensor(labels)] = 1
                masked += int((out.masked_fill(label_mask == 0, 0).argmax(1) == y).sum())
                unmasked += int((out.argmax(1) == y).sum())
                total += len(batch)
    return masked / total, unmasked / total


RUN = dict(dataset="digits", model="preresnet18", partition="classes:2", clients=10, clients_per_round=10,
           width_mix="a1-b1-c1-d1-e1", width_assignment="dynamic", rounds=1, seed=5, algorithm="fedrolex",
           masked_loss=True, classifier_aggregation="label_split", local_eval_rule="source",
           sbn_statistics="test_batch", backend="local")


@pytest.mark.parametrize("batch", [100, 12])  # FedRolex's test batch; one smaller than a shard (two labels' shards)
def test_fedrolex_local_accuracy_normalises_each_clients_shard_by_itself(tmp_path, batch):
    engine = Engine(RunConfig(**RUN, eval_batch_size=batch), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    dataset = engine.dataset
    assert max(len(s) for s in dataset.client_test_indices) > 12  # with batch 12 a shard spans several batches
    model = build_model(engine.model_name)
    model.load_state_dict(engine.backend.get_params(), strict=False)
    masked, unmasked = fedrolex_local(untracked(model), dataset, batch)
    assert summary["local_accuracy"]["mean"] == pytest.approx(masked, abs=1e-12)
    assert summary["local_accuracy_unmasked"]["mean"] == pytest.approx(unmasked, abs=1e-12)
    rows = engine.local
    assert weighted_mean(rows["masked"], rows["samples"]) == pytest.approx(masked, abs=1e-12)


def test_fiarse_evaluation_is_check_accuracy_over_test_batches_of_20():
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 4, (70,), generator=generator)
    x = torch.randn(70, 3, 16, 16, generator=generator) + labels.view(-1, 1, 1, 1) * 0.5
    data = TensorFederatedDataset("toy", "toy", 4, x, labels, x[:50], labels[:50], [torch.arange(70)])
    name = "resnet18-test-fiarse-evaluation"
    config = dict(kind="resnet18", norm="sbn", scaler=False, in_channels=3, num_classes=4, image_size=16,
                  stages=(4, 8, 8, 8))
    register_model(name, config)
    torch.manual_seed(3)
    model = build_model(name)
    server = Server(name, dict(model.named_parameters()), data, eval_batch_size=20, statistics=("test_batch", 10, 0))
    accuracy, _ = server.evaluate()
    # check_accuracy, written out: eval mode, untracked norms, the unshuffled test loader of batch 20
    reference = untracked(build_model(name))
    reference.load_state_dict(model.state_dict(), strict=False)
    reference.eval()
    correct = total = 0
    with torch.no_grad():
        for inputs, targets in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:50], labels[:50]),
                                                           batch_size=20, shuffle=False):
            correct += int(reference(inputs).max(1)[1].eq(targets).sum())
            total += int(np.prod(targets.size()))
    assert accuracy == pytest.approx(correct / total, abs=1e-12)
    # the batch is what the statistics are taken over: 25 a batch gives other logits
    other = Server(name, dict(model.named_parameters()), data, eval_batch_size=25, statistics=("test_batch", 10, 0))
    ours = server.test_logits(np.arange(50))[1]
    assert not np.allclose(ours, other.test_logits(np.arange(50))[1])
