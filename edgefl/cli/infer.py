"""``edgefl infer``: classify images, or measure accuracy on a dataset, with ONNX Runtime.

Needs only the base install (no torch). A dataset's classes are matched to the model's class
names by name (``imagefolder:DIR`` folders too; ``--class-map`` overrides), never by position.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgefl.cli.common import DATASET_HELP, DataDir
from edgefl.errors import ConfigError
from edgefl.report.console import err


def infer(
    model: Path = typer.Option(
        None,
        "--model",
        "-m",
        help="An ONNX model (from `edgefl export`); default: the active deployed one.",
    ),
    images: list[Path] = typer.Argument(
        None, help="Image files (PNG, JPEG …) or .npy arrays [N, C, H, W]."
    ),
    models_dir: str = typer.Option(
        None,
        envvar="EDGEFL_MODELS_DIR",
        help="Where `edgefl deploy` installs models (without --model).",
    ),
    dataset: str = typer.Option(
        None, help="Measure accuracy on this dataset instead. " + DATASET_HELP
    ),
    split: str = typer.Option("test", help="Split of --dataset."),
    data_dir: DataDir = None,
    limit: int = typer.Option(None, help="Use only the first N samples of --dataset."),
    batch_size: int = typer.Option(64, help="Images per ONNX Runtime call."),
    threads: int = typer.Option(None, help="ONNX Runtime intra-op threads (default: its own)."),
    provider: list[str] = typer.Option(
        None,
        help="Execution provider (cpu, cuda, tensorrt; repeatable). Default: the best available.",
    ),
    resize: bool = typer.Option(
        False, "--resize", help="Resize pictures of another size to the model's input."
    ),
    class_map: list[str] = typer.Option(
        None,
        help="FOLDER=CLASS: score a data class as this model class (repeatable). Default: by "
        "name, case and punctuation aside (a folder t-shirt-top is the class T-shirt/top).",
    ),
    skip_unknown: bool = typer.Option(
        False,
        "--skip-unknown-classes",
        help="Leave out data classes (image folders) that match no model class, instead of "
        "refusing the data.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Run an exported model with ONNX Runtime: predictions for images, or accuracy on a dataset."""
    from edgefl.inference import Predictor

    if (
        model is None and images and images[0].suffix == ".onnx"
    ):  # `edgefl infer MODEL.onnx ...`, as before
        model, images = images[0], images[1:]
    if model is None:
        from edgefl.rollout import ModelStore
        from edgefl.rollout import models_dir as resolve_models_dir

        model = ModelStore(resolve_models_dir(models_dir)).active_path()
    if bool(images) == (dataset is not None):
        raise ConfigError("give image files or --dataset NAME, not both and not neither")
    predictor = Predictor(model, threads=threads, providers=provider or None)
    head = {
        "model": str(model),
        "providers": predictor.providers,
        "quantization": predictor.quantization,
    }
    if dataset is not None:
        result = (
            head
            | {"dataset": dataset, "split": split}
            | _evaluate(
                predictor, dataset, split, data_dir, class_map, batch_size, limit, skip_unknown
            )
        )
        if as_json:
            typer.echo(json.dumps(result))
            return
        matched = result["class_map"]
        renamed = {k: v for k, v in matched.items() if k != v}
        if result["skipped_classes"]:
            err.print(
                f"skipped {int(result['skipped_samples'])} samples of classes the model does not "
                "know: " + ", ".join(result["skipped_classes"]),
                highlight=False,
                soft_wrap=True,
                markup=False,
            )
        err.print(
            f"classes: {len(matched)} of the data's classes matched the model's "
            f"{len(predictor.class_names)} "
            + (
                f"by name ({len(renamed)} not spelled alike: "
                + ", ".join(f"{k} -> {v}" for k, v in renamed.items())
                + ")"
                if renamed
                else "by name"
            ),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        typer.echo(
            f"accuracy {100 * result['accuracy']:.2f}% on {int(result['samples'])} {dataset} "
            f"{split} samples "
            f"({result['samples'] / max(result['seconds'], 1e-9):.0f} images/s, "
            f"{', '.join(predictor.providers)})"
        )
        return
    import numpy as np

    arrays = [predictor.load_images([path], resize=resize) for path in images]
    sources = [str(path) for path, a in zip(images, arrays, strict=True) for _ in range(len(a))]
    probs = predictor.probabilities(np.concatenate(arrays), batch_size=batch_size)
    rows = [
        {
            "source": src,
            "class": int(k),
            "name": predictor.class_names[k] if k < len(predictor.class_names) else str(k),
            "probability": float(p[k]),
        }
        for src, p, k in zip(sources, probs, probs.argmax(axis=1), strict=True)
    ]
    if as_json:
        typer.echo(json.dumps(head | {"predictions": rows}))
        return
    for r in rows:
        typer.echo(f"{r['source']}\t{r['name']}\t{r['probability']:.3f}")



def parse_class_map(items: list[str] | None) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--class-map {item!r}: use FOLDER=CLASS")
        mapping[key.strip()] = value.strip()
    return mapping


def _evaluate(
    predictor,
    dataset: str,
    split: str,
    data_dir: str | None,
    class_map: list[str] | None,
    batch_size: int,
    limit: int | None,
    skip_unknown: bool = False,
) -> dict:
    """Accuracy on a dataset whose labels are renumbered to the model's classes by name; with
    ``skip_unknown``, samples of classes the model does not know are left out (and counted)."""
    from edgefl.data.sources import load_arrays, read_folder_for_model, split_folder
    from edgefl.inference import class_index_map

    name, _, path = dataset.partition(":")
    if name.strip().lower() == "imagefolder":
        folder = split_folder(path or data_dir, split)
        x, y, classes = read_folder_for_model(folder, predictor.input_shape[0])
    else:
        x, y, info = load_arrays(dataset, split, data_dir)
        classes = info.class_names
    index, matched = class_index_map(
        classes, predictor.class_names, parse_class_map(class_map), skip_unknown=skip_unknown
    )
    labels = index[y]
    known = labels >= 0
    skipped = [c for c in classes if c not in matched]
    if not known.any():
        raise ConfigError(
            f"none of the data's classes ({', '.join(classes)}) is a class of the model"
        )
    result = predictor.evaluate_arrays(x[known], labels[known], batch_size=batch_size, limit=limit)
    return result | {
        "class_map": matched,
        "skipped_classes": skipped,
        "skipped_samples": float((~known).sum()),
    }
