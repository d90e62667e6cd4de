"""Training augmentation of CIFAR-10 as HeteroFL, FedRolex and FjORD's Flower baseline use it: RandomCrop(32,
padding 4) then a horizontal flip, on the trainer's batches, seeded by (seed, round, client, step) so every backend
and training path gives the same bits (``--augmentation crop-flip``; docs/configs.md)."""

from __future__ import annotations

import torch

from hasfl_ray.training.seeding import torch_generator

#: The random stream of a client's augmentation draws (beside hasfl_ray.training.seeding's kinds).
STREAM_AUGMENT = 8

#: ``augmentation`` values.
AUGMENTATIONS = ("none", "crop_flip")


def crop_flip(x: torch.Tensor, generator: torch.Generator, fill: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """torchvision's ``RandomCrop(size, padding)`` then ``RandomHorizontalFlip()`` on every image of ``x`` ([B, C, H,
    W]): each image padded on every side by ``padding`` pixels of ``fill`` (per channel: a black pixel as the batch is
    standardised), a window of the original size taken at a top-left corner drawn uniformly in [0, 2 padding]², and
    mirrored left-right with probability 1/2. The draws come from ``generator`` (CPU): two corners, then one flip a
    sample."""
    count, channels, height, width = x.shape
    corners = torch.randint(0, 2 * padding + 1, (count, 2), generator=generator)
    flips = torch.rand(count, generator=generator) < 0.5
    padded = fill.to(x.device, x.dtype).view(1, channels, 1, 1).expand(
        count, channels, height + 2 * padding, width + 2 * padding).clone()
    padded[:, :, padding:padding + height, padding:padding + width] = x
    rows = corners[:, :1] + torch.arange(height)  # [B, H]
    cols = corners[:, 1:] + torch.arange(width)  # [B, W]
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    batch = torch.arange(count)[:, None, None, None]
    channel = torch.arange(channels)[None, :, None, None]
    index = [t.to(x.device) for t in (batch, channel, rows[:, None, :, None], cols[:, None, None, :])]
    return padded[index[0], index[1], index[2], index[3]]


def augment_batch(x: torch.Tensor, seed: int, round: int, client: int, step: int, fill: torch.Tensor) -> torch.Tensor:
    """Client ``client``'s batch of local step ``step`` in round ``round``, augmented from its own stream."""
    return crop_flip(x, torch_generator(seed, STREAM_AUGMENT, round, client, step), fill)


def black_pixel(dataset, channels: int, device) -> torch.Tensor:
    """A black pixel of ``dataset``'s standardised image batches, per channel: the padding torchvision's RandomCrop
    puts around a uint8 image before it is standardised (0 for inputs the dataset stores standardised already)."""
    inputs = getattr(dataset, "_inputs", None)
    raw = getattr(dataset, "train_x", None)
    if inputs is not None and raw is not None and raw.dtype == torch.uint8:
        return inputs(torch.zeros((1, channels, 1, 1), dtype=torch.uint8, device=device)).reshape(channels)
    return torch.zeros(channels, device=device)


def augmented(workspace, x: torch.Tensor, task, step: int) -> torch.Tensor:
    """Local step ``step``'s batch ``x`` of ``task``'s client on ``workspace``
    (:class:`~hasfl_ray.training.workspace.Workspace`) as training sees it: as loaded, or with ``augmentation``
    crop_flip cropped and flipped from the client's own stream, the fill a black pixel of the standardised batch
    (computed once a workspace; 0 for inputs the dataset stores standardised already)."""
    if getattr(workspace.settings, "augmentation", "none") == "none":
        return x
    if workspace._fill is None:
        workspace._fill = black_pixel(workspace.dataset, x.shape[1], workspace.device)
    return augment_batch(x, task.seed, task.round, task.client, step, workspace._fill)
