"""The record contract every producer and the results pipeline stand on: benchmark specs
(:mod:`~hpcmem.record.spec`), provenance (:mod:`~hpcmem.record.provenance`), atomic JSONL
(:mod:`~hpcmem.record.jsonl`) and a point's samples (:mod:`~hpcmem.record.samples`).
Nothing here imports a producer or the results pipeline."""
