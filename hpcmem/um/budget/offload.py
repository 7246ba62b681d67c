"""How a job under a GPU budget offloads: the value passed to ``attach``, and the plan's choice.

The value's type is the choice (as FSDP2's ``OffloadPolicy`` and ``CPUOffloadPolicy``):

* :class:`Offload` itself: let the plan pick the strategy (:func:`choose_strategy`) and give
  it its defaults;
* :class:`HostOptimizerOffload` (:mod:`hpcmem.um.host_optimizer`, the ZeRO-Offload class):
  working weights in the autocast dtype stay on the GPU; fp32 master weights and optimizer
  state live in host memory; gradients leave in buckets as autograd finishes them and the
  CPU steps each bucket as it lands, overlapped with the rest of backward;
* :class:`StreamedOffload` (:mod:`hpcmem.um.streamed`): everything lives in pinned host
  memory and visits the GPU around its use, the optimizer stepping chunk by chunk on the GPU.

Each subclass carries only its own fields. :func:`offload_named` makes the value from a
strategy's name and fields (a command line's or a record's), refusing a field the strategy
does not have.

The plan picks ``host_optimizer`` when the optimizer is elementwise and its fixed device
bytes (working weights and the copies' buffers) take at most ``HOST_OPTIMIZER_SHARE`` of the
budget, leaving the rest to activations; ``streamed`` otherwise. Micro-batches accumulate
their gradients on the device where a gradient set fits that share too, else in host
memory. Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import Any, ClassVar

from hpcmem.um.budget.host_memory import HOST_MEMORY
from hpcmem.um.errors import BudgetError

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "ELEMENTWISE",
    "HOST_KERNELS",
    "HOST_OPTIMIZER_SHARE",
    "STATE_DTYPES",
    "STRATEGIES",
    "HostOptimizerOffload",
    "Offload",
    "StreamedOffload",
    "choose_strategy",
    "host_optimizer_bytes",
    "lazy_state_tensors",
    "offload_named",
    "staging_bytes",
    "sums_micro_batches_on_host",
]

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
#: Dtypes the optimizer's moments are kept in, in host memory (``Offload.state_dtype``).
STATE_DTYPES = ("float32", "bfloat16")


def _one_of(name: str, value: object, accepted: tuple[str, ...]) -> None:
    if value is not None and value not in accepted:
        raise BudgetError(f"offload {name}: {value!r} is not one of {', '.join(accepted)}")


_FLAG = ((bool,), "true or false")
_SWITCH = ((bool, type(None)), "true, false or null")
#: The types a field's value must have (beyond the named choices ``_one_of`` checks), and
#: how an error names them; a flag given as a string ("false") would read as true.
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "micro_batches": ((Integral,), "an integer"),
    "recompute": _SWITCH,
    "chunked_loss": _SWITCH,
    "bucket_bytes": ((Integral,), "an integer"),
    "threads": ((Integral, type(None)), "an integer or null"),
    "gpu_share": ((Real, type(None)), "a number or null"),
    "delayed_update": _FLAG,
    "max_grad_norm": ((Real, type(None)), "a number or null"),
    "host_accumulation": _SWITCH,
}


def _check_kinds(value: Offload) -> None:
    """Refuse a field whose value is not of its kind (a flag where a number goes too)."""
    for field in fields(value):
        if field.name not in _KINDS:
            continue
        kinds, text = _KINDS[field.name]
        given = getattr(value, field.name)
        if not isinstance(given, kinds) or (isinstance(given, bool) and bool not in kinds):
            raise BudgetError(f"offload {field.name}: {given!r} is not {text}")


@dataclass(frozen=True)
class Offload:
    """What a budgeted job offloads; this base type lets the plan pick the strategy.

    working_dtype : dtype of the weights on the GPU (the autocast dtype, e.g. ``bfloat16``);
        None: the parameters' own. The streamed strategy fetches fp32 parameters from copies
        in this dtype, widened on the GPU (:mod:`hpcmem.um.streamed.working`).
    micro_batches : backward passes per optimizer step; gradients accumulate until the last
        one.
    recompute : recompute repeated blocks in backward (None: unless everything fits).
    chunked_loss : for a Hugging Face causal LM given ``labels``, the output projection and
        cross-entropy in chunks of tokens, never the whole logits
        (:mod:`hpcmem.um.budget.causal_lm`; the output's ``logits`` is then None). None: on
        where it applies, skipped with the reason in the stats elsewhere; True: refused
        where it does not apply; False: off.
    state_dtype : the dtype the optimizer's moments keep in host memory, ``float32`` (None:
        as the optimizer makes them) or ``bfloat16``, rounded stochastically (up with the
        probability of the dropped bits, so exact on average: rounded to nearest, Adam's
        second moment would stop moving). Each step computes from fp32 moments: the host
        optimizer's native kernel widens them (:mod:`hpcmem.um.host_optimizer.kernel`), the
        streamed strategy on the device, chunk by chunk. Half the host memory of the
        moments (Adam: 12 bytes a parameter instead of 16 under the streamed strategy) and
        less to copy; the trajectory is close to, not the same as, fp32 moments'. State
        kept on the device stays fp32; ``close()`` gives fp32 state back.
    """

    #: the strategy's name in records and on command lines (None: planned)
    strategy: ClassVar[str | None] = None

    working_dtype: str | None = None
    micro_batches: int = 1
    recompute: bool | None = None
    chunked_loss: bool | None = None
    state_dtype: str | None = None

    def __post_init__(self) -> None:
        _check_kinds(self)
        _one_of("working_dtype", self.working_dtype, DTYPES)
        _one_of("state_dtype", self.state_dtype, STATE_DTYPES)
        if self.micro_batches < 1:
            raise BudgetError(f"offload micro_batches: {self.micro_batches} must be >= 1")

    def to_record(self) -> dict[str, object]:
        """The value as a record field: the strategy's name (None: planned) and the fields."""
        return {"strategy": self.strategy, **asdict(self)}

    def shared(self) -> dict[str, Any]:
        """The fields every strategy has, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(Offload)}


@dataclass(frozen=True)
class HostOptimizerOffload(Offload):
    """The host-optimizer strategy (:mod:`hpcmem.um.host_optimizer`), and its own fields.

    bucket_bytes : working-weight bytes per bucket.
    threads : CPU threads of the host optimizer, bound to the job's CPUs less two cores
        left to the threads that launch GPU work (None: one per such CPU;
        :mod:`hpcmem.um.host_optimizer.cores`).
    gpu_share : the share of the trained elements the GPU steps instead of the CPU, their
        master and state kept on the device where the budget has room, else streamed in and
        out (None: planned after the fourth step from the median of the steps before it,
        :mod:`hpcmem.um.host_optimizer.split`; 0: none).
    host_kernel : ``native`` (hpcmem's Adam/AdamW, refused where it does not apply),
        ``torch`` (PyTorch's fused CPU kernel), or None (native where it applies,
        :func:`hpcmem.um.host_optimizer.kernel.bucket_kernel`).
    delayed_update : ZeRO-Offload's one-step delayed parameter update, from the steady phase
        on (the fifth step): ``optimizer.step()`` returns while the CPU still steps, and each
        forward and backward runs on weights that lack the last step's update, which lands
        during it (the buckets the GPU steps are not delayed). The step then takes the longer
        of the compute and the CPU optimizer instead of about their sum; the trajectory is
        not the undelayed one's.
    max_grad_norm : clip the gradients to this global L2 norm (over every rank) before the
        host steps them, as ``torch.nn.utils.clip_grad_norm_`` does; a step whose norm is
        not finite is skipped (None: no clipping). The norm needs every gradient, so the
        host steps the buckets after backward instead of during it.
    batch_split : a Hugging Face causal LM's batch (where the chunked loss stands in) run in
        parts of rows inside its forward where the budget cannot hold its activations whole
        (:mod:`hpcmem.um.budget.batch_split`): None or True measured (the first forward
        runs one row alone, then the rows that fit), a number of rows per part, or False
        (never). The gradients are the whole batch's.
    host_accumulation : where earlier micro-batches, or a split batch's earlier parts, sum
        their gradients: on the device (False: a gradient set held across them), in host
        memory (True: each one's gradients leave as they land, and the CPU adds them up,
        :mod:`hpcmem.um.host_optimizer.part_sums`), or None: in host memory where the
        budget lacks the room for a gradient set (micro-batches: beside the working weights
        in the plan's share of the budget, :func:`sums_micro_batches_on_host`; parts: beside
        one part). On one rank; elsewhere on the device. Where micro-batches sum in host
        memory, a split batch's parts sum on the device and the GPU steps no share of the
        optimizer (there is no room for either).
    host_memory : where the masters, moments and gradients live in host memory
        (:mod:`hpcmem.um.budget.host_memory`): ``torch`` (PyTorch's allocator), or a memory
        kind of :mod:`hpcmem.hbw` (``dram``, ``hbw``, ``hbw_preferred``, ``hbw_interleave``,
        ``dax_kmem``); None: ``hbw_preferred`` where the node has HBM, else ``torch``. On a
        GPU the optimizer's threads run on the GPU's own NUMA node, so the memory is near it.
    """

    strategy: ClassVar[str | None] = "host_optimizer"

    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    threads: int | None = None
    gpu_share: float | None = None
    host_kernel: str | None = None
    delayed_update: bool = False
    max_grad_norm: float | None = None
    batch_split: bool | int | None = None
    host_accumulation: bool | None = None
    host_memory: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("host_memory", self.host_memory, HOST_MEMORY)
        if not isinstance(self.batch_split, bool | None) and (
                not isinstance(self.batch_split, int) or self.batch_split < 1):
            raise BudgetError(f"offload batch_split: {self.batch_split!r} is not true, false, "
                              "null or a number of rows >= 1")
        if self.host_accumulation and self.micro_batches == 1 and self.batch_split is False:
            raise BudgetError("offload host_accumulation: True sums earlier micro-batches or a "
                              "split batch's parts, which micro_batches=1 and batch_split=False "
                              "rule out; accepted: micro_batches above 1, batch_split not "
                              "false, or host_accumulation null or false")
        if self.host_accumulation and self.micro_batches > 1 and self.gpu_share:
            raise BudgetError(f"offload gpu_share: {self.gpu_share} cannot go with "
                              "host_accumulation=True and micro_batches="
                              f"{self.micro_batches} (the device lacks the room for the "
                              "share's state); accepted: gpu_share null or 0")
        if self.bucket_bytes < 1:
            raise BudgetError(f"offload bucket_bytes: {self.bucket_bytes} must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise BudgetError(f"offload threads: {self.threads} must be >= 1")
        if self.gpu_share is not None and not 0 <= self.gpu_share <= 1:
            raise BudgetError(f"offload gpu_share: {self.gpu_share} is not between 0 and 1")
        _one_of("host_kernel", self.host_kernel, HOST_KERNELS)
        if self.max_grad_norm is not None:
            if not 0 < self.max_grad_norm < float("inf"):
                raise BudgetError(f"offload max_grad_norm: {self.max_grad_norm} must be a "
                                  "positive finite number")
            if self.delayed_update or self.gpu_share:
                other = "delayed_update" if self.delayed_update else "gpu_share"
                raise BudgetError(f"offload max_grad_norm: {self.max_grad_norm} cannot go with "
                                  f"{other}={getattr(self, other)!r} (the norm needs every "
                                  "gradient before any bucket steps); accepted: their defaults")


@dataclass(frozen=True)
class StreamedOffload(Offload):
    """The streamed strategy (:mod:`hpcmem.um.streamed`): the shared fields only."""

    strategy: ClassVar[str | None] = "streamed"


#: The strategies by name, and the plan's own choice (None)
_TYPES: dict[str | None, type[Offload]] = {
    None: Offload, "host_optimizer": HostOptimizerOffload, "streamed": StreamedOffload}
STRATEGIES = ("host_optimizer", "streamed")


def offload_named(strategy: str | None, **values: Any) -> Offload:
    """The value of ``strategy`` (None: planned) with ``values``; a field the strategy does
    not have is refused, naming the strategies that have it. With no strategy named, a field
    of the host optimizer's own set away from its default names that strategy."""
    if strategy not in _TYPES:
        raise BudgetError(f"offload strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    kind = _TYPES[strategy]
    own = {f.name for f in fields(HostOptimizerOffload)} - {f.name for f in fields(Offload)}
    if strategy is None and any(not _says_nothing(n, values[n]) for n in own & set(values)):
        kind = HostOptimizerOffload
    accepted = {f.name for f in fields(kind)}
    for name, value in values.items():
        if name in accepted or (name in own and _says_nothing(name, value)):
            continue
        having = [n for n, t in _TYPES.items() if n and name in {f.name for f in fields(t)}]
        raise BudgetError(
            f"offload {name}: {value!r} applies to strategy {' or '.join(having) or 'none'} "
            f"only, not to strategy {kind.strategy}")
    return kind(**{k: v for k, v in values.items() if k in accepted})


def _says_nothing(name: str, value: object) -> bool:
    """Whether a host-optimizer field's ``value`` is its default."""
    return value == next(f.default for f in fields(HostOptimizerOffload) if f.name == name)


def staging_bytes(budget: int) -> tuple[int, int]:
    """Bytes of the host-optimizer mode's out ring and upload buffer under ``budget``: a
    sixteenth of it, at least ``STAGING_MIN_BYTES`` and at most ``STAGING_MAX_BYTES``, and a
    quarter of that."""
    ring = min(STAGING_MAX_BYTES, max(STAGING_MIN_BYTES, budget // 16)) // 256 * 256
    return ring, ring // 4


def host_optimizer_bytes(working_bytes: int, micro_batches: int, budget: int,
                         on_host: bool = False) -> int:
    """Device bytes the host-optimizer mode holds besides activations: the working weights,
    their gradients when several micro-batches accumulate on the device (not ``on_host``),
    and the copies' buffers."""
    accumulated = working_bytes if micro_batches > 1 and not on_host else 0
    return working_bytes + accumulated + sum(staging_bytes(budget))


def sums_micro_batches_on_host(working_bytes: int, micro_batches: int, budget: int,
                               host_accumulation: bool | None = None) -> bool:
    """Whether the host-optimizer mode sums earlier micro-batches' gradients in host memory:
    asked (``host_accumulation``), or planned where a gradient set beside the working
    weights passes the plan's share of the budget."""
    if micro_batches < 2 or host_accumulation is False:
        return False
    fixed = host_optimizer_bytes(working_bytes, micro_batches, budget)
    return bool(host_accumulation) or fixed > HOST_OPTIMIZER_SHARE * budget


def choose_strategy(
    budget: int, working_bytes: int, micro_batches: int, optimizer_name: str | None
) -> str:
    """The strategy for ``budget`` (see the module docstring)."""
    if optimizer_name not in ELEMENTWISE:
        return "streamed"
    fixed = host_optimizer_bytes(working_bytes, micro_batches, budget, on_host=True)
    return "host_optimizer" if fixed <= HOST_OPTIMIZER_SHARE * budget else "streamed"


def lazy_state_tensors(optimizer: Any) -> int:
    """Parameter-shaped state tensors ``optimizer`` makes for each parameter at its first
    step: Adam and AdamW 2 (3 with ``amsgrad``), SGD 1 with momentum and none without; none
    for another class (not known before it steps)."""
    name, defaults = type(optimizer).__name__, getattr(optimizer, "defaults", {})
    if name in ("Adam", "AdamW"):
        return 2 + bool(defaults.get("amsgrad"))
    if name == "SGD":
        return int(bool(defaults.get("momentum")))
    return 0
