"""The training benchmark behind ``hpcmem train``.

``models`` (shapes sized by parameter count), ``networks`` (their torch modules,
built on demand), ``data`` (synthetic
batches the CPU writes every step), ``loop`` (the timed AdamW loop over a
``hpcmem.um.UnifiedMemory``), ``sizing`` (footprint, ``--oversubscribe``),
``record`` (the JSONL record) and ``benchmark`` (one point end to end). Importing
this package does not import torch.
"""

from hpcmem.train.benchmark import NoGPUError, run_point
from hpcmem.train.loop import TrainResult, train
from hpcmem.train.models import CNNShape, TransformerShape, cnn_shape, transformer_shape
from hpcmem.train.point import TrainPoint
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
    "run_point",
    "size_for_footprint",
    "train",
    "transformer_shape",
]
