"""How a job under a GPU budget offloads: the value passed to ``attach``, and the choice.

Two strategies sit behind ``UnifiedMemory.attach(model, optimizer, offload=Offload(...))``:

* ``host_optimizer`` (:mod:`hpcmem.um.host_optimizer`, the ZeRO-Offload class): working
  weights in the autocast dtype stay on the GPU; fp32 master weights and optimizer state
  live in host memory; gradients leave in buckets as autograd finishes them and the CPU
  steps each bucket as it lands, overlapped with the rest of backward;
* ``stream`` (:mod:`hpcmem.um.stream`): everything lives in pinned host memory and visits
  the GPU around its use, the optimizer stepping chunk by chunk on the GPU.

``strategy=None`` lets :func:`choose_strategy` pick: ``host_optimizer`` when the optimizer
is elementwise and its fixed device bytes (working weights, gradients accumulated over
micro-batches, the copies' buffers) take at most ``HOST_OPTIMIZER_SHARE`` of the budget,
leaving the rest to activations; ``stream`` otherwise. Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hpcmem.um.errors import BudgetError

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DELAYED_STREAM",
    "ELEMENTWISE",
    "HOST_KERNELS",
    "HOST_OPTIMIZER_SHARE",
    "STATE_DTYPES",
    "STATE_STREAM",
    "STRATEGIES",
    "Offload",
    "choose_strategy",
    "host_optimizer_bytes",
    "staging_bytes",
]

STRATEGIES = ("host_optimizer", "stream")
#: Working-weight bytes per bucket: one host step and one copy each way.
DEFAULT_BUCKET_BYTES = 64 * 2**20
#: The host-optimizer mode's out ring (gradients leave through it), at least and at most.
STAGING_MIN_BYTES = 8 * 2**20
STAGING_MAX_BYTES = 128 * 2**20
#: Most of the budget the host-optimizer mode's fixed device bytes may take.
HOST_OPTIMIZER_SHARE = 0.5
#: Optimizers (``torch.optim`` class names) the host-optimizer mode can step.
ELEMENTWISE = ("SGD", "Adam", "AdamW")
DTYPES = ("float32", "bfloat16", "float16")
#: The host optimizer's kernels (:mod:`hpcmem.um.host_optimizer.kernel`).
HOST_KERNELS = ("native", "torch")
#: Dtypes the host optimizer keeps Adam's two moments in (``Offload.state_dtype``).
STATE_DTYPES = ("float32", "bfloat16")
#: Why moments narrower than fp32 and the ``stream`` strategy do not go together.
STATE_STREAM = ("offload state_dtype: 'bfloat16' applies to strategy host_optimizer only; "
                "strategy stream keeps the optimizer's own fp32 state")
#: Why the delayed update and the ``stream`` strategy do not go together.
DELAYED_STREAM = ("offload delayed_update: True applies to strategy host_optimizer only; "
                  "strategy stream steps every chunk on the GPU as it passes")


@dataclass(frozen=True)
class Offload:
    """What a budgeted job offloads, and how.

    strategy : ``host_optimizer``, ``stream``, or None (planned from the budget).
    working_dtype : dtype of the weights on the GPU (the autocast dtype, e.g. ``bfloat16``);
        None: the parameters' own.
    micro_batches : backward passes per optimizer step; gradients accumulate on the GPU
        until the last one, which sends them to the host as they finish.
    bucket_bytes : working-weight bytes per bucket.
    threads : CPU threads of the host optimizer, bound to the job's CPUs less two cores
        left to the threads that launch GPU work (None: one per such CPU;
        :mod:`hpcmem.um.host_optimizer.cores`).
    recompute : recompute repeated blocks in backward (None: unless everything fits).
    gpu_share : ``host_optimizer``: the share of the trained elements the GPU steps instead
        of the CPU, their master and state kept on the device where the budget has room,
        else streamed in and out (None: planned after the fourth step from the median of
        the steps before it, :mod:`hpcmem.um.host_optimizer.split`; 0: none).
    host_kernel : ``host_optimizer``: ``native`` (hpcmem's Adam/AdamW, refused where it
        does not apply), ``torch`` (PyTorch's fused CPU kernel), or None (native where it
        applies, :func:`hpcmem.um.host_optimizer.kernel.bucket_kernel`).
    delayed_update : ``host_optimizer``: ZeRO-Offload's one-step delayed parameter update,
        from the steady phase on (the fifth step): ``optimizer.step()`` returns while the
        CPU still steps, and each forward and backward runs on weights that lack the last
        step's update, which lands during it (the buckets the GPU steps are not delayed).
        The step then takes the longer of the compute and the CPU optimizer instead of
        about their sum; the trajectory is not the undelayed one's.
    state_dtype : ``host_optimizer`` with the native kernel: the dtype of Adam's two moments
        in host memory, ``float32`` (None: as PyTorch keeps them) or ``bfloat16``, rounded
        stochastically (:mod:`hpcmem.um.host_optimizer.kernel`): the CPU step moves 20
        bytes an element instead of 28 and the state takes half the host memory; the
        trajectory is close to, not the same as, fp32 state's. Buckets the GPU steps keep
        fp32 state; ``close()`` gives fp32 state back.
    """

    strategy: str | None = None
    working_dtype: str | None = None
    micro_batches: int = 1
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    threads: int | None = None
    recompute: bool | None = None
    gpu_share: float | None = None
    host_kernel: str | None = None
    delayed_update: bool = False
    state_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise BudgetError(f"offload strategy: {self.strategy!r} is not one of "
                              f"{', '.join(STRATEGIES)}")
        if self.working_dtype is not None and self.working_dtype not in DTYPES:
            raise BudgetError(f"offload working_dtype: {self.working_dtype!r} is not one of "
                              f"{', '.join(DTYPES)}")
        for name in ("micro_batches", "bucket_bytes"):
            if getattr(self, name) < 1:
                raise BudgetError(f"offload {name}: {getattr(self, name)} must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise BudgetError(f"offload threads: {self.threads} must be >= 1")
        if self.gpu_share is not None and not 0 <= self.gpu_share <= 1:
            raise BudgetError(f"offload gpu_share: {self.gpu_share} is not between 0 and 1")
        if self.host_kernel is not None and self.host_kernel not in HOST_KERNELS:
            raise BudgetError(f"offload host_kernel: {self.host_kernel!r} is not one of "
                              f"{', '.join(HOST_KERNELS)}")
        if self.delayed_update and self.strategy == "stream":
            raise BudgetError(DELAYED_STREAM)
        if self.state_dtype is not None and self.state_dtype not in STATE_DTYPES:
            raise BudgetError(f"offload state_dtype: {self.state_dtype!r} is not one of "
                              f"{', '.join(STATE_DTYPES)}")
        if self.narrow_state and self.strategy == "stream":
            raise BudgetError(STATE_STREAM)

    @property
    def narrow_state(self) -> bool:
        """Whether the moments are kept narrower than fp32."""
        return self.state_dtype not in (None, "float32")

    def to_record(self) -> dict[str, object]:
        """The value as a record field."""
        return asdict(self)


def staging_bytes(budget: int) -> tuple[int, int]:
    """Bytes of the host-optimizer mode's out ring and upload buffer under ``budget``: a
    sixteenth of it, at least ``STAGING_MIN_BYTES`` and at most ``STAGING_MAX_BYTES``, and a
    quarter of that."""
    ring = min(STAGING_MAX_BYTES, max(STAGING_MIN_BYTES, budget // 16)) // 256 * 256
    return ring, ring // 4


def host_optimizer_bytes(working_bytes: int, micro_batches: int, budget: int) -> int:
    """Device bytes the host-optimizer mode holds besides activations: the working weights,
    their gradients when several micro-batches accumulate, and the copies' buffers."""
    accumulated = working_bytes if micro_batches > 1 else 0
    return working_bytes + accumulated + sum(staging_bytes(budget))


def choose_strategy(
    budget: int, working_bytes: int, micro_batches: int, optimizer_name: str | None
) -> str:
    """The strategy for ``budget`` (see the module docstring)."""
    if optimizer_name not in ELEMENTWISE:
        return "stream"
    fixed = host_optimizer_bytes(working_bytes, micro_batches, budget)
    return "host_optimizer" if fixed <= HOST_OPTIMIZER_SHARE * budget else "stream"
