"""What a trainer holds on its device and both kinds of training read: the dataset there, the network's parameter
specs, the optimiser settings, the intra-op thread count, the cached width-p networks and (``--cuda-graphs``) the
captured local steps; plus the two things every client's training starts and ends with: its sub-model's starting
point cut from the global parameters, the order of its batches, and its packed update.

One-at-a-time training (:mod:`hasfl_ray.training.eager`) and batched training (:mod:`hasfl_ray.training.batched`)
take a :class:`Workspace`; :class:`~hasfl_ray.training.trainer.Trainer` owns one and chooses between them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.models import build_model, extract, pads_exactly, register_model
from hasfl_ray.aggregation.packed import IndexedUpdate, unpack_bits
from hasfl_ray.models.depth import depth_names
from hasfl_ray.models.index_slicing import channel_groups, index_sets
from hasfl_ray.models.slicing import ParamSpec, extract_window, width_channels
from hasfl_ray.training.graphed import StepCache
from hasfl_ray.training.seeding import STREAM_CLIENT, torch_generator
from hasfl_ray.training.task import ClientTask, OptimizerSettings


#: The model cache's bound (local backend and every Ray trainer alike), in bytes: its networks' weights (parameters
#: and buffers) together at most MODEL_CACHE_WEIGHTS times the full-width network's. The least recently used network
#: is dropped, with its memory, while another would not fit. A network's size follows its width (about p² of the
#: full width's), so a count of networks bounds nothing where widths are continuous (every client a new width); a
#: bound in bytes keeps what the cache holds within one network of its bound whatever widths it holds. Three
#: full-width networks hold every width ladder of the built-ins at once (HeteroFL's 1, 1/2, ... 1/16: 1.33; five
#: evenly spaced widths 0.2-1: 2.2; DepthFL's four depths: at most 2.5). A network is rebuilt at no cost to results
#: (its parameters and buffers are set before every use), so the bound trades a rebuild (milliseconds) for memory.
MODEL_CACHE_WEIGHTS = 3
#: ... and at most this many networks, whatever their size (a Python module's own few KiB, for tiny widths).
MODEL_CACHE = 32


def weight_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (what a cached network holds: its gradients are dropped)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def cache_bound_text() -> str:
    """The model cache's bound in words (``hasfl-ray info``)."""
    return (f"an LRU per trainer of at most {MODEL_CACHE_WEIGHTS}x the full-width network's weights "
            f"(parameters and buffers) and at most {MODEL_CACHE} networks")

class Workspace:
    """One device's training state, shared by every client a trainer trains.

    Args:
        dataset: the federated dataset (moved to ``device``).
        model_name: key in :data:`hasfl_ray.models.MODEL_CONFIGS`.
        settings: local optimiser settings.
        device: where training runs.
        threads: intra-op CPU threads while training (fixed so results do not depend on the machine).
        cuda_graphs: keep a :class:`~hasfl_ray.training.graphed.StepCache` (captured on a CUDA device, the same
            static-buffer steps run eagerly on a CPU).
    """

    def __init__(self, dataset: FederatedDataset, model_name: str, settings: OptimizerSettings,
                 device: str = "cpu", threads: int = 1, cuda_graphs: bool = False):
        self.device = torch.device(device)
        self.dataset = dataset.to(self.device)
        self.model_name, self.settings, self.threads = model_name, settings, threads
        register_model(model_name, getattr(dataset, "model_config", None))  # a dataset plug-in's own model
        full = build_model(model_name)
        self.specs: Dict[str, ParamSpec] = full.param_specs()
        #: Whether clients of different widths may train as one stack padded to the widest (``mixed``).
        self.pads_exactly = pads_exactly(full)
        #: The cache's bound in bytes: MODEL_CACHE_WEIGHTS full-width networks' weights.
        self.cache_bound = MODEL_CACHE_WEIGHTS * weight_bytes(full)
        del full
        #: width, or (width, depth) for a depth sub-model -> (its network, its weights' bytes); least recently used
        #: first (an LRU of at most ``cache_bound`` bytes and MODEL_CACHE networks)
        self._models: "OrderedDict[object, Tuple[nn.Module, int]]" = OrderedDict()
        self.cached_bytes = 0  #: the cached networks' weights, in bytes (at most ``cache_bound``)
        self._depth_names: Dict[int, List[str]] = {}
        self.steps: Optional[StepCache] = StepCache(capture=self.device.type == "cuda") if cuda_graphs else None
        # A dataset that gathers a batch on its device from positions held there gets each epoch's order on the
        # device once (no host-to-device copy, which synchronises, per batch); others get host positions.
        self.device_positions = self.device.type != "cpu" and self.dataset.device_positions
        self._unheld: Optional[torch.Tensor] = None  # (masked_loss) [clients, classes]: True where a label is absent
        self._fill: Optional[torch.Tensor] = None  # (augmentation) a black pixel of the standardised batches

    def begin(self) -> None:
        """Before training: fix the intra-op thread count on a CPU."""
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)

    def model_at(self, width: float, depth: Optional[int] = None) -> nn.Module:
        """A cached width-``width`` network on this device (buffers reused across rounds); ``depth``: its depth
        sub-model (:mod:`hasfl_ray.models.depth`), cached under (width, depth)."""
        key = width if depth is None else (width, depth)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key][0]
        model = build_model(self.model_name, width, depth).to(self.device)
        size = weight_bytes(model)
        # the least recently used go, with their captured steps, until the new one fits (a network larger than the
        # bound alone, e.g. a plug-in's, is kept alone)
        while self._models and (len(self._models) >= MODEL_CACHE or self.cached_bytes + size > self.cache_bound):
            _, (_, dropped) = self._models.popitem(last=False)
            self.cached_bytes -= dropped
            if self.steps is not None:
                self.steps.release(set(k[0] if isinstance(k, tuple) else k for k in self._models))
        self._models[key] = (model, size)
        self.cached_bytes += size
        return model

    def release(self, keep: Iterable[float] = ()) -> None:
        """Drop cached models (and their device memory), except those of the widths in ``keep``."""
        keep = set(keep)
        for key in [k for k in self._models if (k[0] if isinstance(k, tuple) else k) not in keep]:
            self.cached_bytes -= self._models.pop(key)[1]
        if self.steps is not None:
            self.steps.release(keep)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def depth_names(self, depth: int) -> List[str]:
        """The parameters a depth-``depth`` sub-model holds, in spec order (:func:`~hasfl_ray.models.depth
        .depth_names`)."""
        if depth not in self._depth_names:
            self._depth_names[depth] = depth_names(build_model(self.model_name), depth, self.specs)
        return self._depth_names[depth]

    @property
    def cached_widths(self) -> List[float]:
        """Widths whose networks are cached, least recently used first."""
        return list(self._models)

    def masked_labels(self, task: ClientTask) -> Optional[torch.Tensor]:
        """With ``task.masked_loss``: bool [num_classes] on this device, True at the labels client ``task.client``
        does not hold in its training data (a zero in :meth:`~hasfl_ray.data.base.FederatedDataset.label_histograms`;
        under ``classes:K`` the complement of its label split), whose logits its loss sets to 0; else None."""
        if not task.masked_loss:
            return None
        if self._unheld is None:
            self._unheld = torch.from_numpy(self.dataset.label_histograms() == 0).to(self.device)
        return self._unheld[task.client]

    def stacked_masked_labels(self, tasks: Iterable[ClientTask]) -> Optional[torch.Tensor]:
        """:meth:`masked_labels` of stacked ``tasks``, bool [C, num_classes] (a client without ``masked_loss``: a
        row of False), or None where no task has ``masked_loss``."""
        tasks = list(tasks)
        if not any(task.masked_loss for task in tasks):
            return None
        rows = [self.masked_labels(task) for task in tasks]
        blank = torch.zeros_like(next(row for row in rows if row is not None))
        return torch.stack([blank if row is None else row for row in rows])

    def index_sets(self, task: ClientTask):
        """Per parameter and dim, the index lists of ``task.channels`` (one sentence if they do not fit the
        width-``task.width`` network)."""
        sets = index_sets(self.specs, task.channels)
        _, sizes = channel_groups(self.specs)
        for group, (chosen, size) in enumerate(zip(task.channels, sizes)):
            if len(chosen) != width_channels(task.width, size):
                raise ValueError(f"client {task.client}'s channels[{group}] holds {len(chosen)} of {size} channels; "
                                 f"expected ceil({task.width:g} x {size}) = {width_channels(task.width, size)}, "
                                 f"its width's")
        return sets

    def task_masks(self, task: ClientTask) -> Optional[Dict[str, torch.Tensor]]:
        """``task.masks`` unpacked: parameter name -> bool tensor of its full shape on this device; None without."""
        if task.masks is None:
            return None
        return {name: unpack_bits(bits, self.specs[name].shape).to(self.device) for name, bits in task.masks}

    @torch.no_grad()
    def starting_point(self, task: ClientTask, global_params: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The client's width-p sub-model cut from ``global_params`` (its window at ``task.offset`` where that is
        not 0; of the parameters its depth holds where it has one), name -> tensor on this device, in spec order."""
        if task.depth is not None:
            held = self.depth_names(task.depth)
            if task.offset:
                return {name: extract_window(global_params[name], self.specs[name], task.width, task.offset)
                        .to(self.device) for name in held}
            return {name: extract(global_params[name], self.specs[name], task.width).to(self.device) for name in held}
        if task.masks is not None:  # the full shapes, each masked parameter 0 outside its mask (w ⊙ m)
            masks = self.task_masks(task)
            return {name: torch.where(masks[name], global_params[name].to(self.device), 0.0) if name in masks
                    else global_params[name].to(self.device) for name in self.specs}
        if task.channels is not None:
            sets = self.index_sets(task)
            return {name: IndexedUpdate.gather(global_params[name], sets[name]).values.to(self.device)
                    for name in self.specs}
        if task.offset:
            return {name: extract_window(global_params[name], spec, task.width, task.offset).to(self.device)
                    for name, spec in self.specs.items()}
        return {name: extract(global_params[name], spec, task.width).to(self.device)
                for name, spec in self.specs.items()}


@torch.no_grad()
def packed_update(trained: Mapping[str, torch.Tensor], initial: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Δ_i = trained − initial per parameter (in ``initial``'s order), as the server takes it: float32 on the CPU,
    contiguous."""
    return {name: (trained[name].detach() - start).to("cpu", torch.float32).contiguous()
            for name, start in initial.items()}


def client_generator(task: ClientTask) -> torch.Generator:
    """The client's own generator: its data order, and whatever its objective draws."""
    return torch_generator(task.seed, STREAM_CLIENT, task.round, task.client)


def local_plan(epochs: int, local_steps: Optional[int], cap: Optional[int]) -> Tuple[int, Optional[int]]:
    """(epochs, most steps) a client trains for: ``epochs`` and ``cap`` (a deadline's partial client), or with
    ``local_steps`` exactly that many iterations (as many epochs as it takes, each a new permutation; at most
    ``cap``)."""
    if local_steps is None:
        return epochs, cap
    return local_steps, local_steps if cap is None else min(local_steps, cap)


def client_batches(generator: torch.Generator, size: int, batch_size: int, epochs: int,
                   device: Optional[torch.device] = None, max_steps: Optional[int] = None) -> Iterator[torch.Tensor]:
    """The positions of every batch a client trains on, in order: a ``randperm`` of its ``size`` samples from
    ``generator`` per epoch (drawn when the epoch's first batch is asked for, so an objective drawing from the same
    generator between steps draws where it always has), cut into batches of ``batch_size``, a batch of fewer than
    two samples skipped after the first (it gives BatchNorm no batch statistics). ``device``: where each epoch's
    order is moved to, once. ``max_steps``: stop after that many batches (None: no limit; the epochs' first batches
    are drawn as before, so the batches taken are the first ``max_steps`` of the unlimited sequence)."""
    taken = 0
    for _ in range(epochs):
        order = torch.randperm(size, generator=generator)
        if device is not None:
            order = order.to(device)
        for start in range(0, size, batch_size):
            positions = order[start:start + batch_size]
            if positions.numel() < 2 and taken > 0:
                continue  # a batch of one sample gives BatchNorm no batch statistics
            if max_steps is not None and taken >= max_steps:
                return
            taken += 1
            yield positions
