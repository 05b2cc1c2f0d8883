"""Graph mode: the ``rbln`` backend of ``torch.compile`` (``backend.py``; README "Graph mode").

It builds on ``dispatch`` (the rules, the op table) and ``runtime`` (storages, programs);
docs/architecture.md has the layer picture."""
