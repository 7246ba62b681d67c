"""The peers: Hugging Face models trained beyond the GPU by each tool, hpcmem among them.

``benchmarks/gpu/hf_offload.py`` trains one work per run with one variant (``variants``:
DeepSpeed ZeRO-Offload, ZeRO-3 and ZenFlow, FSDP2 CPU offload, torchao's
CPUOffloadOptimizer, MegaTrain, hpcmem under a budget, plain ``cuda``) and appends one JSON
record. For the results pipeline, ``record`` checks those records and reads them as the
record contract's, ``spec`` declares their coordinates and metrics, ``tables`` derives the
ratios to ZeRO-Offload, the fastest peer tool and ``cuda`` (on each run's mean step where
every record of the work has it, else the median) and tabulates the points, ``section``
draws them, ``floor`` sets hpcmem's least accepted budget beside each peer's peak, and
``reporting`` registers it all. A data-parallel run (one rank per GPU, its
ranks merged into one record) is a point of its GPU count, scaled against one GPU.
Importing this package imports neither torch nor pandas.
"""
