"""edgefl.data: the file-format readers, synthetic data and the dataset registry (partitioners and
ArrayDataset: tests/test_data_partitions.py)."""

from __future__ import annotations

import gzip
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from edgefl.data import (
    acquire,
    dataset_info,
    dataset_names,
    ensure_fashion_mnist,
    load_dataset,
    pixel_stats,
)
from edgefl.data import datasets as ds_module
from edgefl.data.fetch import main as fetch_main
from edgefl.errors import ConfigError, DataNotFoundError, UnknownNameError

# ---------------------------------------------------------------- IDX files


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    blob = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


def tiny_idx_split(directory: Path, split: str, n: int, gz: bool, dotted: bool = False):
    prefix = {"train": "train", "test": "t10k"}[split]
    sep = "." if dotted else "-"
    images = np.random.default_rng(n).integers(0, 256, size=(n, 28, 28)).astype(np.uint8)
    labels = np.arange(n) % 10
    suffix = ".gz" if gz else ""
    write_idx(directory / f"{prefix}-images{sep}idx3-ubyte{suffix}", images, gz)
    write_idx(directory / f"{prefix}-labels{sep}idx1-ubyte{suffix}", labels, gz)
    return images, labels


def test_idx_reads_gzipped_and_raw_files(tmp_path):
    train_images, train_labels = tiny_idx_split(tmp_path, "train", 12, gz=True)
    test_images, test_labels = tiny_idx_split(tmp_path, "test", 5, gz=False)

    train = load_dataset("fashion-mnist", "train", data_dir=tmp_path)
    test = load_dataset("fashion-mnist", "test", data_dir=tmp_path)

    assert train.x.shape == (12, 1, 28, 28) and train.x.dtype == torch.uint8
    assert np.array_equal(train.x[:, 0].numpy(), train_images)
    assert np.array_equal(train.y.numpy(), train_labels)
    assert np.array_equal(test.x[:, 0].numpy(), test_images)
    assert np.array_equal(test.y.numpy(), test_labels)


def test_idx_finds_torchvision_layout_and_dotted_names(tmp_path):
    images, labels = tiny_idx_split(tmp_path / "MNIST" / "raw", "train", 7, gz=False, dotted=True)

    train = load_dataset("mnist", "train", data_dir=tmp_path)

    assert np.array_equal(train.x[:, 0].numpy(), images)
    assert train.info.class_names[3] == "3"


def test_truncated_idx_file_names_the_file_and_the_problem(tmp_path):
    tiny_idx_split(tmp_path, "train", 12, gz=False)
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])

    with pytest.raises(
        DataNotFoundError, match="header promises 9408 data bytes, file has 9308"
    ) as info:
        load_dataset("fashion-mnist", "train", data_dir=tmp_path)
    assert str(images) in str(info.value)


def test_cut_gzip_and_bad_magic_are_rejected(tmp_path):
    tiny_idx_split(tmp_path / "gz", "train", 12, gz=True)
    gz = tmp_path / "gz" / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:200])
    tiny_idx_split(tmp_path / "magic", "train", 12, gz=False)
    raw = tmp_path / "magic" / "train-labels-idx1-ubyte"
    raw.write_bytes(b"\x12\x34" + raw.read_bytes()[2:])

    with pytest.raises(DataNotFoundError, match="cannot decompress"):
        load_dataset("fashion-mnist", "train", data_dir=tmp_path / "gz")
    with pytest.raises(DataNotFoundError, match="bad magic number"):
        load_dataset("fashion-mnist", "train", data_dir=tmp_path / "magic")


def test_missing_fashion_mnist_says_where_it_looked_and_how_to_install(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fashion-mnist", "train", data_dir=tmp_path / "nowhere")

    message = str(info.value)
    assert str(tmp_path / "nowhere") in message
    assert "sudo apt-get install dataset-fashion-mnist" in message
    assert "train-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message


def test_missing_mnist_says_where_to_put_which_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EDGEFL_DATA", raising=False)

    with pytest.raises(DataNotFoundError) as info:
        load_dataset("mnist", "test")

    message = str(info.value)
    assert f"Put the files in {tmp_path / 'data' / 'mnist'}" in message
    assert "t10k-images-idx3-ubyte" in message
    assert "apt-get" not in message


def test_edgefl_data_is_searched(tmp_path, monkeypatch):
    images, _ = tiny_idx_split(tmp_path / "mnist", "test", 4, gz=True)
    monkeypatch.setenv("EDGEFL_DATA", str(tmp_path))

    test = load_dataset("mnist", "test")

    assert np.array_equal(test.x[:, 0].numpy(), images)


def test_ensure_fashion_mnist_returns_a_complete_dir_and_fails_clearly_without_one(
    tmp_path, capsys
):
    tiny_idx_split(tmp_path / "full", "train", 3, gz=True)
    tiny_idx_split(tmp_path / "full", "test", 3, gz=True)
    tiny_idx_split(tmp_path / "half", "train", 3, gz=True)

    found = ensure_fashion_mnist(tmp_path / "full", allow_apt=False, allow_download=False)
    with pytest.raises(DataNotFoundError, match="t10k-images-idx3-ubyte"):
        ensure_fashion_mnist(tmp_path / "half", allow_apt=False, allow_download=False)
    rc = fetch_main(
        ["fashion-mnist", "--data-dir", str(tmp_path / "half"), "--no-apt", "--no-download"]
    )

    assert found == tmp_path / "full"
    assert rc == 1
    assert "dataset-fashion-mnist" in capsys.readouterr().err


def test_ensure_fashion_mnist_falls_back_to_the_download_and_reports_what_it_tried(
    tmp_path, monkeypatch
):
    def fake_download(target):
        tiny_idx_split(target / "FashionMNIST" / "raw", "train", 3, gz=True)
        tiny_idx_split(target / "FashionMNIST" / "raw", "test", 3, gz=True)

    monkeypatch.setattr(acquire, "_apt_install", lambda: "not root")
    monkeypatch.setattr(acquire, "_torchvision_download", fake_download)
    downloaded = ensure_fashion_mnist(tmp_path / "dl")
    monkeypatch.setattr(acquire, "_torchvision_download", lambda target: "no network")

    with pytest.raises(DataNotFoundError) as info:
        ensure_fashion_mnist(tmp_path / "offline")

    assert downloaded == tmp_path / "dl"
    assert len(load_dataset("fashion-mnist", "test", data_dir=downloaded)) == 3
    assert "Tried: apt-get install dataset-fashion-mnist (not root)" in str(info.value)
    assert f"torchvision download into {tmp_path / 'offline'} (no network)" in str(info.value)


@pytest.mark.slow
def test_real_fashion_mnist_from_the_debian_package():
    if not ds_module.FASHION_MNIST_SYSTEM_DIR.is_dir():
        pytest.skip("dataset-fashion-mnist is not installed")

    train = load_dataset("fashion-mnist", "train", data_dir=ds_module.FASHION_MNIST_SYSTEM_DIR)
    test = load_dataset("fashion-mnist", "test", data_dir=ds_module.FASHION_MNIST_SYSTEM_DIR)

    assert train.x.shape == (60000, 1, 28, 28) and train.x.dtype == torch.uint8
    assert len(test) == 10000
    assert train.class_counts().tolist() == [6000] * 10
    assert test.class_counts().tolist() == [1000] * 10
    mean, std = pixel_stats(train.x.numpy())
    assert mean[0] == pytest.approx(train.info.mean[0], abs=1e-4)
    assert std[0] == pytest.approx(train.info.std[0], abs=1e-4)


# ---------------------------------------------------------------- CIFAR


def cifar_records(
    n: int, first_label: int, label_bytes: int
) -> tuple[bytes, np.ndarray, np.ndarray]:
    images = (
        np.random.default_rng(first_label).integers(0, 256, size=(n, 3, 32, 32)).astype(np.uint8)
    )
    fine = (first_label + np.arange(n)) % 10
    coarse = 9 - fine  # deliberately different, to show which byte is read
    labels = np.stack([coarse, fine], axis=1)[:, 2 - label_bytes :].astype(np.uint8)
    return np.concatenate([labels, images.reshape(n, -1)], axis=1).tobytes(), images, fine


def test_cifar10_binary_batches_are_concatenated_in_order(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    expected_images, expected_labels = [], []
    for i in range(1, 6):
        blob, images, labels = cifar_records(3, first_label=i, label_bytes=1)
        (folder / f"data_batch_{i}.bin").write_bytes(blob)
        expected_images.append(images)
        expected_labels.append(labels)
    (folder / "test_batch.bin").write_bytes(cifar_records(2, 0, 1)[0])

    train = load_dataset("cifar10", "train", data_dir=tmp_path)
    test = load_dataset("cifar10", "test", data_dir=tmp_path)

    assert train.x.shape == (15, 3, 32, 32)
    assert np.array_equal(train.x.numpy(), np.concatenate(expected_images))
    assert np.array_equal(train.y.numpy(), np.concatenate(expected_labels))
    assert len(test) == 2


def test_cifar100_binary_uses_the_fine_label(tmp_path):
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    blob, images, fine = cifar_records(4, first_label=2, label_bytes=2)
    (folder / "test.bin").write_bytes(blob)

    test = load_dataset("cifar100", "test", data_dir=tmp_path)

    assert np.array_equal(test.y.numpy(), fine)
    assert np.array_equal(test.x.numpy(), images)
    assert test.info.num_classes == 100 and len(test.info.class_names) == 100


def write_cifar_python(folder: Path, name: str, images: np.ndarray, labels: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    batch = {b"data": images.reshape(len(images), -1), b"labels": labels}
    (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


def test_cifar10_python_version_loads_and_binary_wins_when_both_exist(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, size=(3, 3, 32, 32)).astype(np.uint8)
    write_cifar_python(tmp_path / "cifar-10-batches-py", "test_batch", images, [7, 8, 9])

    from_python = load_dataset("cifar10", "test", data_dir=tmp_path)
    (tmp_path / "cifar-10-batches-bin").mkdir()
    (tmp_path / "cifar-10-batches-bin" / "test_batch.bin").write_bytes(cifar_records(2, 0, 1)[0])
    preferred = load_dataset("cifar10", "test", data_dir=tmp_path)

    assert np.array_equal(from_python.x.numpy(), images)
    assert from_python.y.tolist() == [7, 8, 9]
    assert len(preferred) == 2


def test_cifar_python_batch_with_foreign_objects_is_refused(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": OrderedDict(), b"labels": []}))

    with pytest.raises(DataNotFoundError, match="refusing to load collections.OrderedDict"):
        load_dataset("cifar10", "test", data_dir=tmp_path)


def test_cifar_binary_of_the_wrong_length_is_rejected(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    (folder / "test_batch.bin").write_bytes(cifar_records(2, 0, 1)[0][:-5])

    with pytest.raises(DataNotFoundError, match="not a multiple of the 3073-byte record"):
        load_dataset("cifar10", "test", data_dir=tmp_path)


def test_missing_cifar_lists_the_expected_files(tmp_path):
    with pytest.raises(DataNotFoundError, match="data_batch_1.bin.*test_batch.bin"):
        load_dataset("cifar10", "train", data_dir=tmp_path)


# ---------------------------------------------------------------- image folders


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def test_cinic10_reads_class_folders_with_cifar_labels(tmp_path):
    rng = np.random.default_rng(0)
    cat = rng.integers(0, 256, size=(32, 32, 3)).astype(np.uint8)
    gray_ship = rng.integers(0, 256, size=(32, 32)).astype(np.uint8)  # CINIC has grayscale images
    write_png(tmp_path / "cinic-10" / "test" / "cat" / "a.png", cat)
    write_png(tmp_path / "cinic-10" / "test" / "ship" / "b.png", gray_ship)

    test = load_dataset("cinic10", "test", data_dir=tmp_path)

    assert test.y.tolist() == [3, 8]
    assert np.array_equal(test.x[0].numpy(), cat.transpose(2, 0, 1))
    assert np.array_equal(test.x[1].numpy(), np.stack([gray_ship] * 3))


def test_imagefolder_grayscale_train_and_test_share_the_info(tmp_path):
    rng = np.random.default_rng(0)
    pictures = {
        "train/apple/0.png": rng.integers(0, 256, size=(8, 6)).astype(np.uint8),
        "train/apple/1.png": rng.integers(0, 256, size=(8, 6)).astype(np.uint8),
        "train/pear/0.png": rng.integers(0, 256, size=(8, 6)).astype(np.uint8),
        "test/pear/0.png": rng.integers(0, 256, size=(8, 6)).astype(np.uint8),
    }
    for name, pixels in pictures.items():
        write_png(tmp_path / name, pixels)
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()  # litter, not a class

    train = load_dataset(f"imagefolder:{tmp_path}", "train")
    test = load_dataset(f"imagefolder:{tmp_path}", "test")

    assert train.info.in_shape == (1, 8, 6)
    assert train.info.class_names == ("apple", "pear")
    assert train.y.tolist() == [0, 0, 1] and test.y.tolist() == [1]
    assert np.array_equal(test.x[0, 0].numpy(), pictures["test/pear/0.png"])
    assert test.info == train.info
    expected_mean = np.mean([p for k, p in pictures.items() if k.startswith("train")]) / 255
    assert train.info.mean[0] == pytest.approx(expected_mean)


def test_imagefolder_with_mixed_sizes_names_the_odd_file(tmp_path):
    write_png(tmp_path / "train" / "a" / "0.png", np.zeros((8, 8, 3), np.uint8))
    write_png(tmp_path / "train" / "b" / "1.png", np.zeros((9, 8, 3), np.uint8))

    with pytest.raises(ConfigError, match=r"1\.png is 8x9 but the dataset's images are 8x8"):
        load_dataset(f"imagefolder:{tmp_path}", "train")


def test_imagefolder_with_an_unreadable_image_names_it(tmp_path):
    write_png(tmp_path / "train" / "a" / "0.png", np.zeros((8, 8), np.uint8))
    (tmp_path / "train" / "a" / "1.jpg").write_bytes(b"not a jpeg")

    with pytest.raises(DataNotFoundError, match=r"1\.jpg cannot be read as an image"):
        load_dataset(f"imagefolder:{tmp_path}", "train")


def test_imagefolder_mixing_gray_and_color_becomes_rgb(tmp_path):
    write_png(tmp_path / "train" / "a" / "0.png", np.full((4, 4), 200, np.uint8))
    write_png(tmp_path / "train" / "b" / "0.png", np.full((4, 4, 3), 50, np.uint8))

    info = dataset_info(f"imagefolder:{tmp_path}")
    train = load_dataset(f"imagefolder:{tmp_path}", "train")

    assert info.in_shape == (3, 4, 4)
    assert train.x[0].unique().tolist() == [200]


# ---------------------------------------------------------------- synthetic and the registry


@pytest.mark.parametrize(
    ("name", "shape"), [("synthetic", (1, 28, 28)), ("synthetic-rgb", (3, 32, 32))]
)
def test_synthetic_is_fixed_balanced_and_matches_its_info(name, shape):
    first, again = load_dataset(name, "train"), load_dataset(name, "train")
    test = load_dataset(name, "test")

    assert torch.equal(first.x, again.x) and torch.equal(first.y, again.y)
    assert first.x.shape == (2000, *shape) and len(test) == 500
    assert first.class_counts().tolist() == [200] * 10
    mean, std = pixel_stats(first.x.numpy())
    assert np.allclose(mean, first.info.mean, atol=0.01) and np.allclose(
        std, first.info.std, atol=0.01
    )


def test_synthetic_classes_are_separable_but_not_identical():
    train, test = load_dataset("synthetic", "train"), load_dataset("synthetic", "test")
    flat_train, flat_test = train.images().flatten(1), test.images().flatten(1)
    centroids = torch.stack([flat_train[train.y == c].mean(0) for c in range(10)])

    accuracy = (torch.cdist(flat_test, centroids).argmin(1) == test.y).float().mean().item()

    assert 0.5 < accuracy < 1.0  # chance is 0.1; a perfect score would make a useless benchmark
    assert not torch.equal(train.x[:500], test.x)


def test_registry_names_info_and_errors():
    names = dataset_names()

    assert {
        "fashion-mnist",
        "mnist",
        "cifar10",
        "cifar100",
        "cinic10",
        "imagefolder",
        "synthetic",
    } <= set(names)
    assert dataset_info("cifar100").in_shape == (3, 32, 32)
    assert dataset_info("FASHION-MNIST").class_names[9] == "Ankle boot"
    with pytest.raises(UnknownNameError, match="unknown dataset 'svhn'; choose one of: cifar10"):
        load_dataset("svhn", "train")
    with pytest.raises(UnknownNameError):
        load_dataset("cifar10:/tmp", "train")
    with pytest.raises(ConfigError, match="split must be one of"):
        load_dataset("synthetic", "valid")
    with pytest.raises(ConfigError, match="imagefolder needs a root"):
        load_dataset("imagefolder", "train")

