"""A whole local step captured once as a CUDA graph and replayed (``--cuda-graphs``).

A local step of the paper's small networks at batch 10-32 is a few hundred tiny kernels (the Shakespeare LSTM:
embedding, two cuDNN LSTM layers, the output layer, cross-entropy, their backward, the clip and the SGD update in
foreach kernels); on a GPU the step is bound by launching them, not by running them. :class:`StaticStep` runs
the step on **fixed tensors** — a static input batch ``x``/``y`` into which each batch is copied, the width-p
network's own parameters, the momentum buffers of a :class:`~hasfl_ray.training.step.LocalSGD` created with
``zero_buffers=True`` and a float64 loss sum — so that on CUDA it can be captured once as a
``torch.cuda.CUDAGraph`` (forward, cross-entropy, backward, clip, SGD step, loss accumulation) and replayed with
one graph launch per step (plus the batch's gather and its two copies into the static buffers).

The op sequence is that of one-at-a-time training (:func:`hasfl_ray.training.eager.train_eager`: ``zero_grad`` →
``F.cross_entropy(model(x), y)`` → ``backward`` → ``LocalSGD.step`` → ``loss_sum += loss``), with two differences
that change no value: the batch is copied into the static buffers first, and the momentum buffers start as zeros
(0·0.9 + g = g, the first gradient, exactly). Without capture (``capture=False``, what a CPU runs) the same class
executes that sequence eagerly on the same static tensors; the CPU tests check that mode against
``Trainer.train`` without graphs bit for bit, and the CUDA tests check captured against eager.

Per client, outside the graph: the client's parameters are copied into the network's parameters (the trainer
does it), the momentum buffers and the loss sum are zeroed and, with ``masked_loss``, the client's label mask is
copied into the static one the captured ``masked_fill`` reads (:meth:`StaticStep.begin_client`). A batch of another
size (an epoch's last, short batch) runs eagerly on the same parameters, buffers and loss sum
(:meth:`StaticStep.eager_step`).

Capture follows PyTorch's whole-network recipe: a few warm-up steps on a side stream (cuBLAS/cuDNN handles and
workspaces are created there, outside the capture), then the capture on that same stream with the gradients set
to None, so backward allocates them from the graph's private memory pool and every replay writes them afresh. The
warm-up trains, so the parameters are saved before and restored after. A step whose kernels cannot be captured
(an op that synchronises with the host) makes the capture fail; that width and batch shape then run eagerly, with
one warning, and are not captured again.

Scalars baked into the captured kernels: the learning rate, momentum, weight decay and clip norm (the SGD update
and the clip take them as kernel arguments), and the batch shape. :class:`StepCache` keys its entries by them and
by the network; the learning rate changes every round (``lr_decay``), so a new round recaptures each width once
and the entry of the previous learning rate is dropped. At most :data:`MAX_STEPS` entries are kept.

Which clients are graphed (:func:`hasfl_ray.training.task.graphable`): those whose objective trains with the
default loss and no gradient adjustment — ``LocalObjective.loss``, ``adjust_gradients`` and ``setup`` not overridden — i.e. hasfl, heterofl,
uniform, random-budget, fedavg and fedrolex. FedProx and SCAFFOLD (a gradient adjustment that reads per-client
tensors) and FjORD (a per-step sampled width) train eagerly, as does a plug-in objective that overrides those
methods. ``--client-batching on`` takes precedence: the clients it batches train as one stacked computation,
and graphs apply to the clients trained one at a time.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.training.precision import forward_precision
from hasfl_ray.training.step import LocalSGD
from hasfl_ray.training.task import OptimizerSettings

logger = logging.getLogger(__name__)

#: Captured steps a trainer keeps (widths x batch shapes of the current learning rate); the oldest go first.
MAX_STEPS = 8
#: Eager steps on the capture stream before capturing (PyTorch's recipe uses 3; the parameters are restored).
WARMUP_STEPS = 3


class StaticStep:
    """One local step of ``model`` on static tensors; captured as a CUDA graph when ``capture`` is True.

    Args:
        model: the width-p network (its parameters are the step's parameters; the trainer copies each client's
            starting point into them).
        x, y: a first batch of the static shape (copied into the static buffers; the warm-up trains on it).
        lr, momentum, weight_decay, clip_norm: :class:`LocalSGD`'s.
        capture: capture a CUDA graph (the model must be on a CUDA device); False runs the same sequence eagerly.
        masked_labels: ``masked_loss``'s first client's bool [num_classes] (True: a label whose logit is set to 0);
            a static copy the step reads, into which :meth:`begin_client` copies each client's. None: no mask.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, momentum: float,
                 weight_decay: float, clip_norm: float, capture: bool, masked_labels: Optional[torch.Tensor] = None,
                 precision: str = "fp32"):
        self.model = model
        self.precision = precision
        self.params: List[torch.Tensor] = list(model.parameters())
        self.optimizer = LocalSGD(self.params, lr, momentum, weight_decay, clip_norm, zero_buffers=True)
        self.x = x.detach().clone()
        self.y = y.detach().clone()
        self.masked_labels = None if masked_labels is None else masked_labels.detach().clone()
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.x.device)
        self.batch = int(self.x.shape[0])
        self.graph: Optional["torch.cuda.CUDAGraph"] = None
        #: The gradient tensors the captured backward writes (kept alive with the graph).
        self.grads: List[Optional[torch.Tensor]] = []
        if capture:
            self._capture()

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _body(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The step's op sequence after zero_grad (on the static tensors: captured, or run eagerly)."""
        with forward_precision(x.device, self.precision, cache=False):  # bf16: autocast (no cast cache: capture)
            logits = self.model(x)
            if self.masked_labels is not None:  # masked_loss: task.mask_logits's masked_fill, on the static mask
                logits = logits.masked_fill(self.masked_labels, 0)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        self.optimizer.step()  # clips first when clip_norm > 0
        self.loss_sum += loss.detach()

    def _capture(self) -> None:
        saved = [p.detach().clone() for p in self.params]
        device = self.x.device
        stream = None
        try:
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_STEPS):
                    self.optimizer.zero_grad()
                    self._body(self.x, self.y)
            torch.cuda.current_stream(device).wait_stream(stream)
            self.optimizer.zero_grad()  # backward allocates the gradients inside the capture, in the graph's pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._body(self.x, self.y)
            self.graph, self.grads = graph, [p.grad for p in self.params]
        except RuntimeError as error:
            logger.warning("CUDA graph capture of a %s step (batch %d) failed, training it eagerly instead: %s",
                           type(self.model).__name__, self.batch, " ".join(str(error).split())[:200])
            self.graph, self.grads = None, []
            self.optimizer.zero_grad()
        finally:
            if stream is not None:
                torch.cuda.current_stream(device).wait_stream(stream)
            with torch.no_grad():  # the warm-up trained: put the client's parameters back
                for param, value in zip(self.params, saved):
                    param.copy_(value)

    def begin_client(self, masked_labels: Optional[torch.Tensor] = None) -> None:
        """Zero the momentum buffers and the loss sum (outside the graph), before a client's first step; with a
        mask, copy the client's ``masked_labels`` into the static one."""
        with torch.no_grad():
            if self.masked_labels is not None:
                self.masked_labels.copy_(masked_labels)
            buffers = [b for b in self.optimizer.buffers if b is not None]
            if buffers:
                torch._foreach_zero_(buffers)
            self.loss_sum.zero_()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step on a batch of the static shape: copy it in, replay the graph (or run the sequence)."""
        self.x.copy_(x)
        self.y.copy_(y)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.optimizer.zero_grad()
            self._body(self.x, self.y)

    def eager_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step on a batch of another size (an epoch's short last batch), eagerly, on the same parameters,
        momentum buffers and loss sum."""
        self.optimizer.zero_grad()
        self._body(x, y)

    def run(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """:meth:`step` for a batch of the static shape, :meth:`eager_step` for any other."""
        if x.shape == self.x.shape and y.shape == self.y.shape:
            self.step(x, y)
        else:
            self.eager_step(x, y)


Key = Tuple[float, Tuple[int, ...], torch.dtype, Tuple[int, ...], bool, float, float, float, float]


class StepCache:
    """A trainer's :class:`StaticStep` per (width, batch shape, learning rate, momentum, weight decay, clip norm).

    Args:
        capture: capture CUDA graphs (a CUDA trainer); False keeps the eager static-buffer mode (CPU).
        max_steps: most entries kept; the least recently used goes first.
    """

    def __init__(self, capture: bool, max_steps: int = MAX_STEPS):
        self.capture, self.max_steps = capture, max_steps
        self._steps: "OrderedDict[Key, StaticStep]" = OrderedDict()
        #: (width, shapes) whose capture failed: later entries of them run eagerly without trying again.
        self._failed: set = set()
        #: Steps built (captured when ``capture``) so far, for tests and benchmarks.
        self.built = 0

    def __len__(self) -> int:
        return len(self._steps)

    def get(self, model: nn.Module, width: float, x: torch.Tensor, y: torch.Tensor, lr: float,
            settings: OptimizerSettings, masked_labels: Optional[torch.Tensor] = None) -> StaticStep:
        """The step for this width's ``model`` at the shapes of batch ``x``/``y`` and these optimiser scalars, with
        a static label mask or without (``masked_labels``: this client's, or None), built (and captured) on first
        use; an entry of the same width and shapes with other scalars (the previous round's learning rate) or
        another network object is replaced."""
        shape = (float(width), tuple(x.shape), x.dtype, tuple(y.shape), masked_labels is not None)
        key: Key = shape + (float(lr), float(settings.momentum), float(settings.weight_decay),
                            float(settings.clip_norm))
        step = self._steps.get(key)
        if step is not None and step.model is model:
            self._steps.move_to_end(key)
            return step
        for old in [k for k in self._steps if k[:5] == shape]:
            del self._steps[old]
        capture = self.capture and shape not in self._failed
        step = StaticStep(model, x, y, lr, settings.momentum, settings.weight_decay, settings.clip_norm, capture,
                          masked_labels, settings.precision)
        if capture and not step.captured:
            self._failed.add(shape)
        self.built += 1
        self._steps[key] = step
        while len(self._steps) > self.max_steps:
            self._steps.popitem(last=False)
        return step

    def release(self, keep: Iterable[float] = ()) -> None:
        """Drop the steps (and their graphs' memory) of every width not in ``keep``."""
        keep = {float(w) for w in keep}
        for key in [k for k in self._steps if k[0] not in keep]:
            del self._steps[key]
