"""The local web page of `vitlab serve`: drop an image, see the top-5 and where the ViT looks, the
paper's Figure 7 of the model, and the training runs on disk.

    models.py  where a model comes from (the command line's flags as data) and the loaded copies
    look.py    the top-k, the attention overlays and Figure 7 of an image, as `vitlab predict`,
               `vitlab attention` and `vitlab inspect` compute them
    runs.py    the training runs and `vitlab reproduce` reports under a folder
    page.py    the Gradio page over them (Gradio is the optional extra `vitlab[serve]`)
"""
