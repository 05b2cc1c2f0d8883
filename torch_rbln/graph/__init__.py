"""Graph mode: the ``rbln`` backend of ``torch.compile`` (``backend.py``; docs/graph-mode.md ("Graph mode")).

It builds on ``dispatch`` (the rules, the op table) and ``runtime`` (storages, programs);
docs/architecture.md has the layer picture."""
