"""``--dataset hf:PATH?text=COLUMN --partition flwr:natural_id:ID``: a Hugging Face text column read character by
character as Shakespeare is (hasfl_ray/data/shakespeare.py): one client per distinct ID (Flower's NaturalIdPartitioner
order), its rows' text joined by spaces in row order, encoded in Shakespeare's 95-symbol vocabulary, next-character
windows of 80 split per client 80/20 in text order (:func:`~hasfl_ray.data.shakespeare.split_windows`), trained by the
built-in Shakespeare LSTM."""

from __future__ import annotations

import numpy as np
import torch

from hasfl_ray.data.base import TextFederatedDataset
from hasfl_ray.data.flower import column_array, flwr_clients, is_flwr, parse_flwr
from hasfl_ray.data.shakespeare import RECOMMENDED_BATCH_SIZE, SEQ_LEN, VOCAB, encode, split_windows
from hasfl_ray.errors import DataError

def load_hub_text(spec: str, train, column: str, num_clients: int, seed: int, partition: str) -> TextFederatedDataset:
    """The federated next-character dataset of ``train``'s text ``column`` (the module's rule); one sentence for a
    partition other than ``flwr:natural_id:ID``, a column that is not text, or a client with too little text."""
    if not (is_flwr(partition) and parse_flwr(partition)[0] == "natural_id"):
        raise DataError(f"dataset {spec!r} is text, whose clients are its authors; expected --partition "
                        "flwr:natural_id:COLUMN (one client per id, as Shakespeare by role)")
    id_column = parse_flwr(partition)[1]
    for name in (column, id_column):
        if name not in train.column_names:
            raise DataError(f"dataset {spec!r} has no column {name!r}; expected one of {', '.join(train.column_names)}")
    if getattr(train.features[column], "dtype", None) not in ("string", "large_string"):
        raise DataError(f"dataset {spec!r}: column {column!r} is not text; expected a string column for ?text=")
    parts, names = flwr_clients(partition, np.zeros(len(train), dtype=np.int64), num_clients, seed,
                                {id_column: column_array(train, id_column)})
    rows = column_array(train, column).to_pylist()
    pieces, client_starts, test_starts, offset = [], [], [], 0
    for name, part in zip(names, parts):
        symbols = encode(" ".join(rows[i] or "" for i in part))
        fit, held = split_windows(np.arange(max(len(symbols) - SEQ_LEN, 0), dtype=np.int64))
        if not len(fit) or not len(held):
            raise DataError(f"dataset {spec!r}: client {name!r} has {len(symbols)} characters; expected enough for "
                            f"training and test windows of {SEQ_LEN} (about 480 or more)")
        pieces.append(symbols)
        client_starts.append(torch.from_numpy(fit + offset))
        test_starts.append(torch.from_numpy(held + offset))
        offset += len(symbols)
    return TextFederatedDataset(spec, "shakespeare", len(VOCAB), torch.from_numpy(np.concatenate(pieces)),
                                client_starts, torch.cat(test_starts), names, SEQ_LEN,
                                recommended_batch_size=RECOMMENDED_BATCH_SIZE)
