"""``torch.rbln.compare``: why is my answer different -- each device op and each module call
against a golden run on the host, live, and records of two runs compared offline.

``with torch.rbln.compare(golden="float32") as c:`` checks every op's result against the same
op on the host from the same inputs widened (its own error), and every module's output against
a golden copy of the module (the accumulated error); ``print(c)`` shows the first divergence
and the worst ops and modules. ``torch.rbln.compare.record(path)`` writes a run's ops and
module outputs to a directory; ``python -m torch_rbln.compare A B`` compares two records (a
CPU-fp32 run and an rbln-fp16 run, two releases). docs/numerics.md ("Numerics").
"""

from .record import Recorder, load, record
from .region import RBLNCompare, compare

compare.record = record

__all__ = ["compare", "record", "load", "RBLNCompare", "Recorder"]
