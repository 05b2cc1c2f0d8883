"""Graph mode: the ``rbln`` backend of ``torch.compile`` (see ``backend.py``)."""
