"""FedRolex's window as its code rolls it (issue 35 item 6), checked against the source's rule re-implemented here,
not against hasfl-ray's own window functions.

The source: github.com/AIoT-MLSys-Lab/FedRolex, commit 813510997e1802eb756d53baa4229c90ce5ac008,
``resnet_server.py::ResnetServerRoll.split_model`` with ``overlap`` None (the ``roll`` algorithm of
``main_resnet.py``)::

    if 'conv1' in k or 'conv2' in k:
        if idx_i[m] is None:
            idx_i[m] = torch.arange(input_size, device=v.device)
        input_idx_i_m = idx_i[m]
        scaler_rate = self.model_rate[user_idx[m]] / cfg['global_model_rate']
        local_output_size = int(np.ceil(output_size * scaler_rate))
        if self.cfg['overlap'] is None:
            roll = self.rounds % output_size
            model_idx = torch.arange(output_size, device=v.device)
        ...
        model_idx = torch.roll(model_idx, roll, -1)
        output_idx_i_m = model_idx[:local_output_size]
        idx_i[m] = output_idx_i_m
    elif 'shortcut' in k:
        input_idx_i_m = idx[m][k.replace('shortcut', 'conv1')][1]
        output_idx_i_m = idx_i[m]
    elif 'linear' in k:
        input_idx_i_m = idx_i[m]
        output_idx_i_m = torch.arange(output_size, device=v.device)

1-dim weights and biases take ``idx_i[m]`` (the linear bias: all of it), and ``distribute`` cuts
``v[torch.meshgrid(param_idx[m][k])]``. ``self.rounds`` is 0 in ``__init__`` and ``step`` adds 1 after each round's
``combine``, so the first round (``main_resnet.py``'s epoch 1) rolls by 0: round t of hasfl-ray (0-based) is
``rounds`` = t. The source has no step size (one channel a round): ``rolex_step`` 1, the default.
"""

import math

import numpy as np
import pytest
import torch

from algorithm_runs import P_MAX_4, SAMPLES_4, small_config
from hasfl_ray.algorithms.fedrolex import FedRolex
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model, register_model, resnet_config
from hasfl_ray.models.slicing import extract_window, window_indices

#: HeteroFL's and FedRolex's levels a-e.
RATES = (1.0, 0.5, 0.25, 0.125, 0.0625)
#: More than 512 rounds, so every stage's window (64 to 512 channels) wraps round at least once.
ROUNDS = 520


def source_split_model(parameters, rates, rounds):
    """``ResnetServerRoll.split_model`` (overlap None) for one client of each rate: per client, name -> the index
    tuple (output, input) of a weight of more than one dim, or the index of a 1-dim weight or a bias."""
    idx_i = [None for _ in range(len(rates))]
    idx = [dict() for _ in range(len(rates))]
    for k, v in parameters.items():
        parameter_type = k.split('.')[-1]
        for m in range(len(rates)):
            if 'weight' in parameter_type or 'bias' in parameter_type:
                if parameter_type == 'weight':
                    if v.dim() > 1:
                        input_size = v.size(1)
                        output_size = v.size(0)
                        if 'conv1' in k or 'conv2' in k:
                            if idx_i[m] is None:
                                idx_i[m] = torch.arange(input_size, device=v.device)
                            input_idx_i_m = idx_i[m]
                            scaler_rate = rates[m] / 1.0
                            local_output_size = int(np.ceil(output_size * scaler_rate))
                            roll = rounds % output_size
                            model_idx = torch.arange(output_size, device=v.device)
                            model_idx = torch.roll(model_idx, roll, -1)
                            output_idx_i_m = model_idx[:local_output_size]
                            idx_i[m] = output_idx_i_m
                        elif 'shortcut' in k:
                            input_idx_i_m = idx[m][k.replace('shortcut', 'conv1')][1]
                            output_idx_i_m = idx_i[m]
                        elif 'linear' in k:
                            input_idx_i_m = idx_i[m]
                            output_idx_i_m = torch.arange(output_size, device=v.device)
                        else:
                            raise ValueError('Not valid k')
                        idx[m][k] = (output_idx_i_m, input_idx_i_m)
                    else:
                        idx[m][k] = idx_i[m]
                else:
                    input_size = v.size(0)
                    if 'linear' in k:
                        idx[m][k] = torch.arange(input_size, device=v.device)
                    else:
                        idx[m][k] = idx_i[m]
    return idx


def resnet(arch):
    """(name, full-width parameters) of ResNet ``arch`` on CIFAR-10's 3x32x32 images and 10 classes."""
    name, config = resnet_config(arch, 3, 10, 32, None)
    register_model(name, config)
    return name, dict(build_model(name).named_parameters())


def rolex(name, **options):
    algorithm = FedRolex(small_config(algorithm="fedrolex", **options), P_MAX_4, SAMPLES_4)
    algorithm.model_name = name  # as the engine sets it before the first round
    return algorithm


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_every_layers_window_is_the_sources_torch_roll_for_hundreds_of_rounds(arch):
    name, parameters = resnet(arch)
    specs = build_model(name).param_specs()
    assert set(specs) == set(parameters)
    algorithm = rolex(name)
    for t in range(ROUNDS):
        offset = algorithm.window_offset(t, 0)
        assert all(algorithm.window_offset(t, client) == offset for client in (1, 2, 3))  # one window a round
        source = source_split_model(parameters, RATES, rounds=t)
        for m, rate in enumerate(RATES):
            for key, spec in specs.items():
                ours = window_indices(spec, spec.sliced_shape(rate), offset)
                theirs = source[m][key]
                theirs = theirs if isinstance(theirs, tuple) else (theirs,)
                for d, index in enumerate(theirs):  # the output and input channels; kernels are kept whole
                    assert torch.equal(ours[d], index), (arch, t, rate, key, d)
                for d in range(len(theirs), len(ours)):
                    assert torch.equal(ours[d], torch.arange(spec.shape[d])), (arch, t, rate, key, d)


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_extracted_sub_models_are_the_sources_distribute(arch):
    name, parameters = resnet(arch)
    specs = build_model(name).param_specs()
    algorithm = rolex(name)
    for t in (0, 1, 37, 64, 300, 511, 513):
        source = source_split_model(parameters, RATES, rounds=t)
        for m, rate in enumerate(RATES):
            for key, spec in specs.items():
                v, index = parameters[key].detach(), source[m][key]
                theirs = v[torch.meshgrid(*index, indexing="ij")] if v.dim() > 1 else v[index]
                assert torch.equal(extract_window(v, spec, rate, algorithm.window_offset(t, 0)), theirs), (t, key)


def test_the_window_starts_at_minus_t_and_forward_keeps_the_former_plus_t():
    name, _ = resnet("preresnet18")
    source, forward = rolex(name), rolex(name, rolex_direction="forward")
    assert source.options.rolex_direction == "source"  # the default
    assert [source.window_offset(t, 2) for t in range(4)] == [0, 511, 510, 509]  # 512: the lcm of 64 ... 512
    assert [forward.window_offset(t, 2) for t in range(4)] == [0, 1, 2, 3]
    stepped = rolex(name, rolex_step=3)
    assert stepped.window_offset(4, 1) == -12 % 512
    assert rolex(name, rolex_step=3, rolex_direction="forward").window_offset(4, 1) == 12
    for C in (64, 128, 256, 512):  # each layer reads it modulo its own channel count
        assert source.window_offset(70, 0) % C == -70 % C


def test_the_engine_gives_fedrolex_its_model():
    engine = Engine(RunConfig.from_dict(dict(backend="local", algorithm="fedrolex", rounds=1, seed=4)))
    engine.prepare()
    assert engine.algorithm.model_name == engine.model_name == "digits"
    channels = {d.channels for s in build_model("digits").param_specs().values() for d in s.dims if d.scaled}
    assert engine.algorithm.window_offset(5, 0) == -5 % math.lcm(*channels)


def test_fedrolex_outside_an_engine_says_what_its_window_needs():
    algorithm = FedRolex(small_config(algorithm="fedrolex"), P_MAX_4, SAMPLES_4)
    with pytest.raises(RuntimeError, match="model_name"):
        algorithm.window_offset(1, 0)


@pytest.mark.parametrize("value", ["backward", "", "Source", 1])
def test_a_bad_direction_is_one_sentence(value):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"backend": "local", "algorithm": "fedrolex", "rolex_direction": value})
    message = str(info.value)
    assert "rolex_direction is" in message and "expected" in message and "\n" not in message


def test_a_bad_direction_flag_exits_2_with_one_sentence(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["simulate", "--algorithm", "fedrolex", "--algo-opt", "rolex_direction=back",
                                       "--backend", "local", "--quiet", "--out", "run"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "rolex_direction is 'back'" in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
