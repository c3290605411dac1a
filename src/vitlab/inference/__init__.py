"""Using a trained model: the top-k classes of image files with the weights' own preprocessing
(predict.py), and export to safetensors or ONNX (export.py)."""
