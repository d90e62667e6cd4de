"""Small Hugging Face datasets written with ``datasets`` + ``save_to_disk`` for the hf: and flwr: tests (nothing is
downloaded)."""

import numpy as np

#: The writers of :func:`write_image_dataset`: 5 natural clients, named out of sorted order on purpose.
WRITERS = ("w3", "w0", "w4", "w1", "w2")


def image_table(rows=240, size=12, channels=3, classes=4, seed=0):
    """Columns of a small image dataset: ``img`` (H x W x C uint8 arrays), ``y`` (labels), ``writer`` (an id)."""
    rng = np.random.default_rng(seed)
    shape = (rows, size, size, channels) if channels > 1 else (rows, size, size)
    images = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return {"img": list(images), "y": rng.integers(0, classes, size=rows).tolist(),
            "writer": [WRITERS[i] for i in rng.integers(0, len(WRITERS), size=rows)], "caption": ["a b"] * rows}


def write_image_dataset(path, splits=False, **kwargs):
    """A dataset saved at ``path`` (a DatasetDict with train and test when ``splits``); returns ``path`` as text."""
    import datasets

    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict(image_table(**kwargs))
    if splits:
        table = datasets.DatasetDict({"train": table, "test": datasets.Dataset.from_dict(
            image_table(rows=40, seed=1, **{k: v for k, v in kwargs.items() if k != "rows" and k != "seed"}))})
    table.save_to_disk(str(path))
    return str(path)
