"""ONNX export, parity check and int8 quantization of edgefl models; model files.

    from edgefl.export.checkpoint import load_device_model
    from edgefl.export.onnx_export import export_model
    from edgefl.export.quantize import quantize_int8

    model = load_device_model("runs/my-run", "d03")           # run_dir/models/d03.safetensors
    report = export_model(model, "d03.onnx", class_names=names, parity_images=x_test)
    quantize_int8("d03.onnx", "d03.int8.onnx", calibration_images=x_train[:256])

Run them with `edgefl.inference.Predictor`. Modules: `checkpoint` (safetensors model files),
`onnx_export` (export + metadata + parity, and how batch-statistics BatchNorm is handled),
`quantize` (static QDQ int8), `run` (what `edgefl export` does with a run directory),
`deployment` (which exported file each device gets: `edgefl deploy`), `errors`. Import names from
their module: this package imports nothing, so that `edgefl.export.checkpoint` (the simulation
saves models with it) does not load onnx, nor `edgefl.export.deployment` torch.
"""
