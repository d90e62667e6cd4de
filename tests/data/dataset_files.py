"""Builders of tiny dataset files in each official format (idx, pickled batches, LEAF JSON, play text)."""

import json
import pickle
import struct

import numpy as np


def write_idx(path, array):
    """An idx file of unsigned bytes, as MNIST/EMNIST ship them."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def make_emnist_root(root, num_train=240, num_test=62, seed=0):
    """A torchvision root with byclass idx files whose images are stored transposed, as EMNIST's are.

    Each upright image has a bright pixel at row 2, column 20 (so the stored file has it at row 20, column 2).
    Returns the upright train images, train labels, upright test images and test labels.
    """
    rng = np.random.default_rng(seed)
    raw = root / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    out = []
    for split, n in (("train", num_train), ("test", num_test)):
        labels = np.arange(n) % 62
        rng.shuffle(labels)
        upright = rng.integers(0, 50, size=(n, 28, 28), dtype=np.uint8)
        upright[:, 2, 20] = 255
        write_idx(raw / f"emnist-byclass-{split}-images-idx3-ubyte", upright.transpose(0, 2, 1))
        write_idx(raw / f"emnist-byclass-{split}-labels-idx1-ubyte", labels.astype(np.uint8))
        out += [upright, labels]
    return out


def cifar_batch(n, seed, keys=str):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in np.arange(n) % 10]
    return {keys("batch_label"): keys("training batch"), keys("data"): data, keys("labels"): labels}


def make_cifar_root(root, per_batch=20, numpy1_names=False, bytes_keys=False):
    """A torchvision root with cifar-10-batches-py holding five training batches and a test batch.

    ``numpy1_names`` rewrites the pickles to reference numpy.core (as the official batches, pickled
    under numpy 1, do); ``bytes_keys`` uses bytes dict keys, as Python 2 pickles decode them.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    keys = (lambda s: s.encode()) if bytes_keys else str
    batches = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        batch = cifar_batch(per_batch, seed=i, keys=keys)
        payload = pickle.dumps(batch, protocol=2)
        if numpy1_names:
            payload = payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / name).write_bytes(payload)
        batches[name] = batch
    return batches



def make_cifar100_root(root, per_class_train=2, per_class_test=1, seed=0, numpy1_names=False, bytes_keys=False):
    """A torchvision root with cifar-100-python holding ``train``, ``test`` and ``meta`` in the official format: dicts
    pickled at protocol 2 with ``filenames``, ``batch_label``, ``fine_labels`` (every one of the 100 classes
    ``per_class_*`` times, shuffled), ``coarse_labels`` (fine // 5, a stand-in for the official superclasses) and
    ``data`` (N x 3072 uint8, the R, G, B planes). ``numpy1_names`` and ``bytes_keys`` as :func:`make_cifar_root`.
    Returns {file name: the dict pickled}."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    keys = (lambda s: s.encode()) if bytes_keys else str
    written = {}
    for split, per_class in (("train", per_class_train), ("test", per_class_test)):
        fine = np.repeat(np.arange(100), per_class)
        rng.shuffle(fine)
        n = len(fine)
        batch = {keys("filenames"): [keys(f"img_{split}_{i}.png") for i in range(n)],
                 keys("batch_label"): keys(f"{split}ing batch 1 of 1"),
                 keys("fine_labels"): [int(v) for v in fine], keys("coarse_labels"): [int(v) // 5 for v in fine],
                 keys("data"): rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)}
        payload = pickle.dumps(batch, protocol=2)
        if numpy1_names:
            payload = payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / split).write_bytes(payload)
        written[split] = batch
    meta = {keys("fine_label_names"): [keys(f"class_{c}") for c in range(100)],
            keys("coarse_label_names"): [keys(f"super_{c}") for c in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return written

PLAY_TEXT = """THE TRAGEDY OF TESTING
by William Shakespeare

PERSONS REPRESENTED.

Alpha, a coder.
Beta, a reviewer.

ACT I.

Scene I. A room.

[Enter Alpha and Beta.]

Alp.
{alpha}

Beta.
{beta}
[Exit.]

Alp.
{alpha2}
"""

COLON_TEXT = """First Citizen:
{first}

SECOND CITIZEN:
{second}

First Citizen:
{first2}
"""


def sentence(words, seed):
    rng = np.random.default_rng(seed)
    vocab = ["thou", "art", "the", "king", "of", "naught", "and", "yet", "I", "love", "thee", "well", "sir"]
    return " ".join(rng.choice(vocab, size=words)) + "."


def leaf_json(users):
    """LEAF all_data JSON of ``users`` {name: text}: stride-1 80-character windows over each text."""
    data = {"users": [], "hierarchies": [], "num_samples": [], "user_data": {}}
    for name, text in users.items():
        xs = [text[i:i + 80] for i in range(len(text) - 80)]
        ys = [text[i + 80] for i in range(len(text) - 80)]
        data["users"].append(name)
        data["hierarchies"].append(name.split("_")[0])
        data["num_samples"].append(len(xs))
        data["user_data"][name] = {"x": xs, "y": ys}
    return json.dumps(data)
