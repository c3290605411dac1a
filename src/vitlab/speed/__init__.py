"""How fast a model runs, and nothing else: every path here gives the model's numbers to float rounding,
and which path runs is decided by fixed rules on what the machine is, never by a stopwatch mid-run.

    machine.py   what this machine is: the CPU's vendor, instruction sets and kind, read once
    rules.py     `Plan` (attention kernel, library of products, compile, pieces) and its table of rules; the
                 engine's table (`ENGINE_RULES`: where ONNX Runtime runs inference, `vitlab.inference.engine`)
    onednn.py    oneDNN's products where torch's own are slow (AMD): weights packed once, or per step in training
    compiled.py  torch.compile (with freezing for inference), and a batch run a few images at a time
    paths.py     a plan put to work: the inference function, the training context; the caller's model untouched
    tune.py      measured tuning, an explicit step (`vitlab tune`, `--fast-path tuned`), kept per machine
    fastpath.py  `--fast-path auto|tuned|compile|eager|off`: the plan of a command, said out loud

`vitlab bench` (`vitlab.bench`), which measures vitlab next to timm and ONNX Runtime, sits above the
layers it measures.
"""
