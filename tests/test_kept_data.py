"""Datasets decoded once and kept in memory (edgefl.data.idx.keep_idx): what a fork server does for
the device processes it forks (edgefl.runtime.forkwarm), so each does not decompress them again."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from edgefl.data import idx, load_arrays
from edgefl.data.sources import keep_dataset
from edgefl.runtime.processes import KEEP_DATA_ENV, keep_named_datasets
from tests.test_data import tiny_idx_split


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch):
    monkeypatch.setattr(idx, "_KEPT", {})


def undecodable(monkeypatch):
    def fail(path):
        raise AssertionError(f"{path} was decoded again")

    monkeypatch.setattr(idx, "_decode_idx", fail)


def test_a_kept_file_is_read_from_memory_as_a_writable_copy_of_its_own(tmp_path, monkeypatch):
    images, labels = tiny_idx_split(tmp_path, "train", 12, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    idx.keep_idx(path)
    undecodable(monkeypatch)
    first = idx.read_idx(path)
    np.testing.assert_array_equal(first, images)
    first[0, 0, 0] ^= 0xFF  # a reader may change its array: the kept one stays as decoded
    np.testing.assert_array_equal(idx.read_idx(path), images)


def test_a_changed_file_is_decoded_again(tmp_path):
    tiny_idx_split(tmp_path, "train", 12, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    idx.keep_idx(path)
    images, _ = tiny_idx_split(tmp_path, "train", 7, gz=True)  # other content, size and time
    os.utime(path, ns=(0, 1))  # a different modification time even where the clock is coarse
    np.testing.assert_array_equal(idx.read_idx(path), images)


def test_keep_dataset_keeps_both_splits_where_load_arrays_finds_them(tmp_path, monkeypatch):
    train, train_labels = tiny_idx_split(tmp_path, "train", 12, gz=True)
    test, _ = tiny_idx_split(tmp_path, "test", 5, gz=False)
    assert keep_dataset("mnist", str(tmp_path))
    assert len(idx._KEPT) == 4  # images and labels of train and test
    undecodable(monkeypatch)
    x, y, _ = load_arrays("mnist", "train", tmp_path)
    np.testing.assert_array_equal(x[:, 0], train)
    np.testing.assert_array_equal(y, train_labels)
    np.testing.assert_array_equal(load_arrays("mnist", "test", tmp_path)[0][:, 0], test)


def test_keep_dataset_keeps_nothing_it_cannot_read(tmp_path):
    assert not keep_dataset("mnist", str(tmp_path))  # no files
    assert not keep_dataset("synthetic")  # not made of IDX files
    assert idx._KEPT == {}


def test_the_fork_server_keeps_what_its_environment_names(tmp_path, monkeypatch, caplog):
    tiny_idx_split(tmp_path, "train", 12, gz=True)
    tiny_idx_split(tmp_path, "test", 5, gz=True)
    monkeypatch.setenv(KEEP_DATA_ENV, json.dumps([["mnist", str(tmp_path)],
                                                  ["fashion-mnist", str(tmp_path / "none")]]))
    assert keep_named_datasets() == ["mnist"]
    assert len(idx._KEPT) == 4
    monkeypatch.setenv(KEEP_DATA_ENV, "not json")
    with caplog.at_level(logging.WARNING, logger="edgefl.runtime.processes"):
        assert keep_named_datasets() == []  # never raises: the fork server must start
    assert KEEP_DATA_ENV in caplog.text
    monkeypatch.delenv(KEEP_DATA_ENV)
    assert keep_named_datasets() == []
