"""Fast paths, chosen by what this machine measures, and their measurement:

    calibration.py   which kernel is faster here, timed once per CPU and torch version and remembered
    cpu_inference.py Linear weights packed once for oneDNN (GELU fused), where that pays
    cpu_training.py  each fp32 training product by the library measured faster here
    attention.py     torch's fused attention kernel or the explicit products, as measured here
    compiled.py      torch.compile (freezing for inference), and whether a run repays the compile
    fastpath.py      the path a command takes (`--fast-path auto|compile|eager|off`), said out loud
    bench.py         `vitlab bench`: vitlab next to timm, timm compiled and ONNX Runtime
"""
