"""Shakespeare: LEAF JSON, NAME: and Abbrev. play text, vocabulary, per-role split, lazy windows, failures."""

import json
import os

import numpy as np
import pytest
import torch

from dataset_files import COLON_TEXT, PLAY_TEXT, leaf_json, sentence
from hasfl_ray.data import load_dataset
from hasfl_ray.data.shakespeare import (SEQ_LEN, UNKNOWN_INDEX, VOCAB, decode, encode, load_shakespeare,
                                        parse_speeches, split_windows)
from hasfl_ray.errors import DataError


def long_text(seed, sentences=40):
    return " ".join(sentence(12, seed * 1000 + k) for k in range(sentences))


def test_vocabulary_is_printable_ascii_with_space_for_unknown():
    assert len(VOCAB) == 95 and VOCAB[0] == " " and VOCAB[-1] == "~"
    text = "Hark! 'Tis ~ 42 {x}"
    assert decode(encode(text)) == text
    assert encode("é\t\n").tolist() == [UNKNOWN_INDEX] * 3 and VOCAB[UNKNOWN_INDEX] == " "


def test_parse_abbreviated_play_text():
    roles = parse_speeches(PLAY_TEXT.format(alpha="To be or not.", beta="Tis nobler\nin the mind.",
                                            alpha2="Ay, there's the rub."))
    # Title, cast list and scene headings belong to no one; stage directions are dropped; lines join with a space.
    assert roles == {"ALP": ["To be or not.", "Ay, there's the rub."], "BETA": ["Tis nobler in the mind."]}


def test_parse_colon_speaker_text():
    roles = parse_speeches(COLON_TEXT.format(first="We are accounted poor.", second="Speak, speak.",
                                             first2="You are all resolved\nrather to die."))
    assert roles == {"FIRST CITIZEN": ["We are accounted poor.", "You are all resolved rather to die."],
                     "SECOND CITIZEN": ["Speak, speak."]}


def test_split_leaves_no_overlapping_windows():
    starts = np.arange(1000)
    train, test = split_windows(starts)
    assert len(train) == 800 and test[0] == 800 + SEQ_LEN - 1  # LEAF's 79-window gap
    assert train[-1] + SEQ_LEN <= test[0]  # the first test input starts after the last training input ends
    train, test = split_windows(starts[::7])
    assert train[-1] + SEQ_LEN <= test[0] and len(train) == int(0.8 * len(starts[::7]))


def write_plays(folder):
    folder.mkdir()
    texts = {}
    for play, seed in (("tempest", 1), ("lear", 2)):
        alpha, beta, alpha2 = long_text(seed), long_text(seed + 10, 20), long_text(seed + 20)
        (folder / f"{play}_gut.txt").write_text(PLAY_TEXT.format(alpha=alpha, beta=beta, alpha2=alpha2))
        texts[f"{play}/ALP"] = alpha + " " + alpha2
        texts[f"{play}/BETA"] = beta
    (folder / "COPYING.txt").write_text("Not a play.\n")
    return texts


def test_plays_folder_gives_play_role_clients_and_lazy_windows(tmp_path):
    texts = write_plays(tmp_path / "plays")
    ds = load_dataset("shakespeare", 3, 0.3, 0, data_dir=str(tmp_path))  # finds plays/ below the folder
    by_size = sorted(texts, key=lambda name: (-len(texts[name]), name))
    assert ds.client_names == by_size[:3]
    assert (ds.name, ds.model, ds.num_classes, ds.recommended_batch_size) == ("shakespeare", "shakespeare", 95, 10)
    for client, name in enumerate(ds.client_names):
        text = texts[name]
        windows = len(text) - SEQ_LEN
        assert ds.client_size(client) == int(0.8 * windows)
        x, y = ds.client_batch(client, torch.tensor([0, 5, ds.client_size(client) - 1]))
        assert x.shape == (3, SEQ_LEN) and x.dtype == torch.int64 and y.dtype == torch.int64
        assert decode(x[1]) == text[5:5 + SEQ_LEN] and decode(y[1]) == text[5 + SEQ_LEN]
        last = ds.client_size(client) - 1
        assert decode(x[2]) == text[last:last + SEQ_LEN]
    # The stream holds each kept role's text once: memory does not grow with the number of windows.
    assert ds.stream.dtype == torch.uint8
    assert ds.stream.numel() == sum(len(texts[name]) for name in ds.client_names)
    expected_test = sum(len(texts[n]) - SEQ_LEN - int(0.8 * (len(texts[n]) - SEQ_LEN)) - (SEQ_LEN - 1)
                        for n in ds.client_names)
    assert ds.test_size == expected_test
    xs, ys = zip(*ds.test_batches(64))
    assert sum(len(y) for y in ys) == ds.test_size and all(x.shape[1] == SEQ_LEN for x in xs)
    # Ground truth over next-character labels.
    histograms = ds.label_histograms()
    assert histograms.shape == (3, 95) and histograms.sum(axis=1).tolist() == [ds.client_size(i) for i in range(3)]
    tv = ds.tv_distances()
    assert tv.shape == (3,) and np.all((tv >= 0) & (tv <= 1))


def test_stride_keeps_every_kth_window(tmp_path):
    texts = write_plays(tmp_path / "plays")
    full = load_shakespeare(2, str(tmp_path / "plays"))
    strided = load_shakespeare(2, str(tmp_path / "plays"), stride=4)
    assert strided.client_names == full.client_names
    windows = len(texts[full.client_names[0]]) - SEQ_LEN
    assert strided.client_size(0) == int(0.8 * len(range(0, windows, 4)))
    x_full, _ = full.client_batch(0, torch.tensor([8]))
    x_strided, _ = strided.client_batch(0, torch.tensor([2]))
    assert torch.equal(x_full, x_strided)


def test_colon_text_without_plays(tmp_path):
    first, second, first2 = long_text(1), long_text(2, 30), long_text(3)
    path = tmp_path / "tiny.txt"
    path.write_text(COLON_TEXT.format(first=first, second=second, first2=first2))
    ds = load_shakespeare(2, str(path))
    assert ds.client_names == ["FIRST CITIZEN", "SECOND CITIZEN"]
    x, y = ds.client_batch(0, torch.tensor([0]))
    assert decode(x[0]) == (first + " " + first2)[:SEQ_LEN]


def test_leaf_json_file_and_folder(tmp_path):
    texts = {"TEMPEST_PROSPERO": long_text(1), "TEMPEST_ARIEL": long_text(2, 30), "LEAR_FOOL": long_text(3, 20)}
    (tmp_path / "all_data.json").write_text(leaf_json(texts))
    ds = load_dataset("shakespeare", 2, 0.3, 0, data_dir=str(tmp_path / "all_data.json"))
    assert ds.client_names == ["TEMPEST_PROSPERO", "TEMPEST_ARIEL"]
    # Overlapping LEAF windows share one stream: about one stored symbol per sample.
    assert ds.stream.numel() == len(texts["TEMPEST_PROSPERO"]) + len(texts["TEMPEST_ARIEL"])
    for client, name in enumerate(ds.client_names):
        x, y = ds.client_batch(client, torch.arange(ds.client_size(client)))
        text = texts[name]
        assert all(decode(x[j]) == text[j:j + SEQ_LEN] and VOCAB[int(y[j])] == text[j + SEQ_LEN]
                   for j in range(0, len(y), 97))
    # A folder of LEAF JSON files, users split across files, and non-contiguous samples.
    folder = tmp_path / "leaf"
    folder.mkdir()
    (folder / "all_data_0.json").write_text(leaf_json({"A_X": long_text(4)}))
    data = json.loads(leaf_json({"B_Y": long_text(5)}))
    data["user_data"]["B_Y"]["x"].reverse()  # windows out of order: each one stored on its own
    data["user_data"]["B_Y"]["y"].reverse()
    (folder / "all_data_1.json").write_text(json.dumps(data))
    ds = load_shakespeare(2, str(folder))
    assert sorted(ds.client_names) == ["A_X", "B_Y"]
    client = ds.client_names.index("B_Y")
    x, y = ds.client_batch(client, torch.tensor([0]))
    assert decode(x[0]) == data["user_data"]["B_Y"]["x"][0] and decode(y) == data["user_data"]["B_Y"]["y"][0]
    train, test = ds.client_starts[client], ds.test_starts
    assert int(train.max()) + SEQ_LEN <= int(test[test > train.min()].min())


@pytest.mark.parametrize("content, needle", [
    ("{not json", "is not valid LEAF JSON"),
    ('{"users": ["a"]}', "lacks the users list and user_data object"),
    ('{"users": ["a"], "user_data": {"a": {"x": ["short"], "y": ["x"]}}}', "is not an 80-character window"),
])
def test_bad_leaf_json_in_one_sentence(tmp_path, content, needle):
    path = tmp_path / "all_data.json"
    path.write_text(content)
    with pytest.raises(DataError, match=needle) as caught:
        load_shakespeare(1, str(path))
    assert "\n" not in str(caught.value) and "--data-dir" in str(caught.value)


def test_too_few_roles_names_the_flag(tmp_path):
    write_plays(tmp_path / "plays")
    with pytest.raises(DataError, match=r"only 4 roles .* pass --clients 4 or fewer"):
        load_shakespeare(20, str(tmp_path))


def test_text_without_speeches(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("Just some prose.\nWithout any speaker.\n")
    with pytest.raises(DataError, match="holds no speeches"):
        load_shakespeare(1, str(path))


def test_missing_data_and_offline_download(tmp_path, offline):
    with pytest.raises(DataError) as caught:
        load_shakespeare(20, str(tmp_path))
    message = str(caught.value)
    assert "no Shakespeare data found at" in message and "--data-dir" in message and "--download" in message
    assert offline == [] and "\n" not in message
    with pytest.raises(DataError) as caught:  # --download names LEAF's source; it fetches nothing
        load_shakespeare(20, str(tmp_path), download=True)
    message = str(caught.value)
    assert message.startswith("Shakespeare is not downloaded") and "github.com/TalwalkarLab/leaf" in message
    assert "\n" not in message and "--data-dir" in message and "all_data.json" in message
    assert offline == [] and list(tmp_path.iterdir()) == []


def test_shared_plays_and_tinyshakespeare(shared_data):
    folder = os.path.join(shared_data, "shakespeare")
    plays = load_dataset("shakespeare", 20, 0.3, 42, data_dir=folder)
    assert plays.num_clients == 20 and plays.client_names[0] == "hamlet/HAM"
    assert all("/" in name for name in plays.client_names)
    assert min(plays.client_size(i) for i in range(20)) > 10000 and plays.test_size > 0
    tiny = load_shakespeare(20, os.path.join(folder, "tinyshakespeare.txt"))
    assert tiny.client_names[:3] == ["GLOUCESTER", "DUKE VINCENTIO", "KING RICHARD II"]
    # GLOUCESTER speaks 37,405 characters; speeches joined by one space add a few hundred.
    assert 37405 <= tiny.client_size(0) / 0.8 + SEQ_LEN <= 1.01 * 37405
    # TV distances over next-character labels are small but not zero for natural role partitions.
    tv = plays.tv_distances()
    assert np.all(tv > 0) and np.all(tv < 0.5)
