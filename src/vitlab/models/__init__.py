"""Models: the paper's ViT in one file (vit.py), the CNN baseline and hybrid stem (cnn.py), the named
variants as data (registry.py), the weights' provenance (pretrained_cfg.py), and `create_model`, the
one door to a model (factory.py, exported as `vitlab.create_model`)."""
