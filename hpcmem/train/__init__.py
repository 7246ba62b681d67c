"""The training benchmark behind ``hpcmem train``.

``point`` (what was asked for, validated), ``models`` (shapes sized by parameter count),
``networks`` (their torch modules, built on demand), ``data`` (synthetic batches the CPU
writes every step), ``loop`` (the timed AdamW loop over a ``hpcmem.um.UnifiedMemory``),
``sizing`` (footprint, ``--oversubscribe``), ``record`` (the JSONL record), ``benchmark``
(one point end to end) and, for the results pipeline, ``spec`` (coordinates and metrics),
``tables`` and ``report``. Importing this package does not import torch.
"""

from hpcmem.train.benchmark import NoGPUError, run_point
from hpcmem.train.loop import TrainResult, train
from hpcmem.train.models import CNNShape, TransformerShape, cnn_shape, transformer_shape
from hpcmem.train.point import TrainPoint, make_point
from hpcmem.train.sizing import Footprint, footprint, size_for_footprint

__all__ = [
    "CNNShape",
    "Footprint",
    "NoGPUError",
    "TrainPoint",
    "TrainResult",
    "TransformerShape",
    "cnn_shape",
    "footprint",
    "make_point",
    "run_point",
    "size_for_footprint",
    "train",
    "transformer_shape",
]
