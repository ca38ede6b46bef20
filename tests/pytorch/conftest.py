"""Make the helper modules of this directory (``_torch_inputs``, ``_torch_ddp_worker``)
importable whatever pytest's import mode (spawned DDP workers inherit ``sys.path``)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
