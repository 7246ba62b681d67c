"""What a Slurm cluster offers a user, asked from its client commands.

``sinfo`` lists the nodes of each partition (CPUs, memory, GPUs, features),
``scontrol`` the partitions' limits and the cluster's accounting settings, and
``sacctmgr`` the user's associations (account, partition, QOS, limits, and those of the
accounts above) and the QOS that exist, with their limits (:mod:`hpcmem.slurm.limits`).
Without accounting (no slurmdbd) the associations are unknown and say why.

What the commands print is checked as it is read (a site's wrapper scripts and odd Slurm
versions print other things): output that is not UTF-8 text, or a line or field not in
the form parsed here, is a :class:`SlurmCommandError` naming the command and what it
printed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from hpcmem.errors import BadInputError, HpcmemError
from hpcmem.inputs import decode_text, refused, whole_number
from hpcmem.slurm.limits import ASSOCIATION_FIELDS, QOS_FIELDS, Limits, limits_from
from hpcmem.slurm.values import minutes

__all__ = [
    "Association",
    "ClusterFacts",
    "NodeFacts",
    "PartitionFacts",
    "QueuedJob",
    "SlurmCommandError",
    "cluster_facts",
    "gpu_count",
    "node_facts",
    "partition_facts",
    "queued_jobs",
    "slurm_command",
]

#: seconds any one Slurm client command may take
COMMAND_TIMEOUT = 60
_PARTITIONS = ("scontrol", "show", "partition", "-o")
_NODES = ("sinfo", "-h", "-N", "-a", "-o", "%R|%N|%c|%m|%G|%f")
#: the user's jobs in the queue (pending, running, ...: what MaxSubmitJobs counts); then USER
_QUEUED = ("squeue", "-h", "-o", "%i|%P|%a|%q", "-u")
#: the most CPUs, or MB of memory, a node may have (Slurm counts both in 64 bits)
_MOST = 2**63 - 1


class SlurmCommandError(HpcmemError):
    """A Slurm client command is missing, failed, timed out or printed what is not read."""


def _shown(args: tuple[str, ...]) -> str:
    return f"`{' '.join(args)}`"


@contextmanager
def _reading() -> Iterator[None]:
    """A failed check of what a command printed is a SlurmCommandError (which the
    preflight and the watchdog report)."""
    try:
        yield
    except BadInputError as error:
        raise SlurmCommandError(str(error)) from None


def slurm_command(*args: str, shown: str | None = None) -> str:
    """The standard output of a Slurm client command; raises SlurmCommandError naming it
    (as ``shown``, where its whole command line would be too long to read)."""
    shown = shown or _shown(args)
    try:
        done = subprocess.run(args, capture_output=True, timeout=COMMAND_TIMEOUT)
    except FileNotFoundError:
        raise SlurmCommandError(f"`{args[0]}` not found: Slurm's client commands must be on "
                                "PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{shown} did not answer within {COMMAND_TIMEOUT}s") from None
    if done.returncode != 0:
        printed = (done.stderr.strip() or done.stdout.strip()).splitlines()
        why = printed[0].decode(errors="backslashreplace") if printed else done.returncode
        raise SlurmCommandError(f"{shown} failed: {why}")
    with _reading():
        return decode_text(done.stdout, f"output of {shown}")


@dataclass(frozen=True)
class NodeFacts:
    """One node as a partition offers it."""

    name: str
    cpus: int
    memory_mb: int
    gpus: int
    features: frozenset[str]


@dataclass(frozen=True)
class PartitionFacts:
    """One partition: whether it takes jobs, its limits, and its nodes."""

    name: str
    state: str
    default: bool
    max_time_min: int | None
    allow_accounts: frozenset[str] | None
    deny_accounts: frozenset[str]
    allow_qos: frozenset[str] | None
    deny_qos: frozenset[str]
    nodes: tuple[NodeFacts, ...] = ()
    #: the partition's own QOS (``QoS=``), whose limits apply to its jobs too
    qos: str | None = None

    @property
    def total_cpus(self) -> int:
        """CPUs of all its nodes together."""
        return sum(node.cpus for node in self.nodes)


@dataclass(frozen=True)
class Association:
    """An account the user may charge, on one partition or all (``partition`` empty)."""

    account: str
    partition: str
    qos: frozenset[str]
    #: the QOS of its jobs that name none (None: Slurm's ``normal``)
    default_qos: str | None = None
    #: its limits, then those of each account above it (:func:`~hpcmem.slurm.limits.applying`)
    limits: tuple[Limits, ...] = ()


@dataclass(frozen=True)
class QueuedJob:
    """One of the user's jobs in the queue already (pending or running), as squeue lists it."""

    job_id: str
    partition: str
    account: str
    qos: str


@dataclass(frozen=True)
class ClusterFacts:
    """Everything the preflight compares a run's jobs with."""

    name: str
    user: str
    enforce: frozenset[str]
    partitions: dict[str, PartitionFacts]
    default_account: str | None = None
    associations: tuple[Association, ...] = ()
    qos: frozenset[str] = frozenset()
    #: the limits of each QOS, by name
    qos_limits: dict[str, Limits] = field(default_factory=dict)
    #: no slurmdbd: Slurm checks no account or QOS
    accounting_disabled: bool = False
    #: why ``sacctmgr`` could not list the accounts and QOS, or None
    accounting_error: str | None = None
    #: the user's jobs in the queue already (None: squeue could not list them)
    queued: tuple[QueuedJob, ...] | None = ()
    #: why squeue could not list them, or None
    queue_error: str | None = None

    @property
    def knows_associations(self) -> bool:
        """Whether accounts and QOS were listed (accounting on and sacctmgr answered)."""
        return not (self.accounting_disabled or self.accounting_error)

    @property
    def default_partition(self) -> str | None:
        """The partition of jobs that name none."""
        return next((p.name for p in self.partitions.values() if p.default), None)

    def association(self, account: str | None, partition: str | None) -> Association | None:
        """The user's association for ``account`` on ``partition`` (else on every
        partition), or None."""
        for wanted in (partition, ""):
            for association in self.associations:
                if association.account == account and association.partition == wanted:
                    return association
        return None

    def accounts(self) -> set[str]:
        """Every account the user has an association with."""
        return {a.account for a in self.associations}


def gpu_count(gres: str) -> int:
    """GPUs in a Gres string (``gpu:h100:4(S:0-1),shard:8`` -> 4; ``(null)`` -> 0)."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu":
            count = parts[-1] if len(parts) > 1 else "1"
            total += int(count) if count.isascii() and count.isdigit() else 1
    return total


def _names(value: str) -> frozenset[str] | None:
    """A comma-separated name list of scontrol; None for ``ALL``."""
    if value in ("ALL", ""):
        return None
    return frozenset(name.lower() for name in value.split(",") if name)


def _key_values(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol show ... -o`` line (values may hold spaces)."""
    pairs = re.split(r"\s+(?=[A-Za-z][\w/:.]*=)", line.strip())
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def partition_facts(line: str) -> PartitionFacts:
    """One partition from its line of ``scontrol show partition -o``, without its nodes."""
    entry = _key_values(line)
    if "PartitionName" not in entry:
        raise refused(_shown(_PARTITIONS), line, "is a line without PartitionName=",
                      "one partition per line: PartitionName=NAME Key=value ...")
    return PartitionFacts(
        name=entry["PartitionName"],
        state=entry.get("State", "UNKNOWN"),
        default=entry.get("Default") == "YES",
        max_time_min=minutes(entry.get("MaxTime", ""), f"{_shown(_PARTITIONS)} MaxTime"),
        allow_accounts=_names(entry.get("AllowAccounts", "ALL")),
        deny_accounts=_names(entry.get("DenyAccounts", "")) or frozenset(),
        allow_qos=_names(entry.get("AllowQos", "ALL")),
        deny_qos=_names(entry.get("DenyQos", "")) or frozenset(),
        qos=None if entry.get("QoS", "N/A") == "N/A" else entry["QoS"].lower(),
    )


def node_facts(line: str) -> tuple[str, NodeFacts]:
    """A node and its partition from their line of ``sinfo -N -o %R|%N|%c|%m|%G|%f``."""
    fields = line.split("|")
    if len(fields) != 6:
        raise refused(_shown(_NODES), line, "is not six fields separated by '|'",
                      "PARTITION|NODE|CPUS|MEMORY_MB|GRES|FEATURES per line")
    partition, name, cpus, memory, gres, features = fields
    return partition, NodeFacts(
        name=name,
        cpus=whole_number(cpus, f"{_shown(_NODES)} CPUS", minimum=0, maximum=_MOST),
        memory_mb=whole_number(memory, f"{_shown(_NODES)} MEMORY_MB", minimum=0, maximum=_MOST),
        gpus=gpu_count(gres),
        features=frozenset(f for f in features.split(",") if f and f != "(null)"),
    )


def queued_jobs(text: str) -> tuple[QueuedJob, ...]:
    """The jobs of ``squeue -h -o %i|%P|%a|%q -u USER`` output (lines of other shapes left
    out), their account and QOS in lower case as sacctmgr lists them."""
    jobs = []
    for line in filter(None, text.splitlines()):
        fields = line.split("|")
        if len(fields) == 4:
            job_id, partition, account, qos = fields
            jobs.append(QueuedJob(job_id, partition, account.lower(), qos.lower()))
    return tuple(jobs)


def _lines(args: tuple[str, ...]) -> list[str]:
    return [line for line in slurm_command(*args).splitlines() if line.strip()]


def _partitions() -> dict[str, PartitionFacts]:
    with _reading():
        partitions = {facts.name: facts for facts in map(partition_facts, _lines(_PARTITIONS))}
        nodes: dict[str, list[NodeFacts]] = {name: [] for name in partitions}
        for partition, node in map(node_facts, _lines(_NODES)):
            nodes.setdefault(partition, []).append(node)
    return {name: replace(facts, nodes=tuple(nodes.get(name, ())))
            for name, facts in partitions.items()}


def _config() -> dict[str, str]:
    config = {}
    for line in slurm_command("scontrol", "show", "config").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def _listing(*args: str) -> list[dict[str, str]]:
    """The lines of ``sacctmgr -n -P ARGS format=FIELDS`` as field -> value (the last
    argument names the fields)."""
    fields = args[-1].removeprefix("format=").split(",")
    command = ("sacctmgr", "-n", "-P", *args)
    entries = []
    for line in slurm_command(*command).splitlines():
        values = line.split("|")
        if len(values) != len(fields):
            raise refused(_shown(command), line, f"is not {len(fields)} fields separated "
                          "by '|'", "|".join(fields))
        entries.append(dict(zip(fields, values, strict=True)))
    return entries


def _account_limits(cluster: str, accounts: set[str]) -> dict[str, tuple[str, Limits]]:
    """Each of ``accounts`` and every account above them: its parent and its limits."""
    found: dict[str, tuple[str, Limits]] = {}
    while wanted := sorted(accounts - set(found)):
        listed = _listing("show", "assoc", "where", f"cluster={cluster}",
                          f"account={','.join(wanted)}",
                          f"format=Account,User,ParentName,{','.join(ASSOCIATION_FIELDS)}")
        for entry in (e for e in listed if not e["User"]):
            account = entry["Account"].lower()
            found[account] = (entry["ParentName"].lower(), limits_from(
                f"account {account!r}", entry, "sacctmgr show assoc"))
        missing = set(wanted) - set(found)
        found.update((account, ("", Limits(f"account {account!r}"))) for account in missing)
        accounts = {parent for parent, _ in found.values() if parent}
    return found


def _chain(account: str, accounts: dict[str, tuple[str, Limits]]) -> tuple[Limits, ...]:
    """The limits of ``account`` and of each account above it, nearest first."""
    chain, seen = [], set()
    while account and account not in seen:
        seen.add(account)
        parent, limits = accounts[account]
        chain.append(limits)
        account = parent
    return tuple(chain)


def _associations(cluster: str, user: str) -> tuple[Association, ...]:
    """The user's associations on ``cluster``, each with its limits and those above it."""
    with _reading():
        listed = _listing("show", "assoc", "where", f"user={user}", f"cluster={cluster}",
                          f"format=Account,Partition,QOS,DefaultQOS,"
                          f"{','.join(ASSOCIATION_FIELDS)}")
        accounts = _account_limits(cluster, {e["Account"].lower() for e in listed})
        associations = []
        for entry in listed:
            account = entry["Account"].lower()
            own = limits_from(f"the association of user {user!r} with account {account!r}",
                              entry, "sacctmgr show assoc")
            associations.append(Association(
                account, entry["Partition"],
                frozenset(q for q in entry["QOS"].lower().split(",") if q),
                default_qos=entry["DefaultQOS"].lower() or None,
                limits=(own, *_chain(account, accounts))))
    return tuple(associations)


def _qos_limits() -> dict[str, Limits]:
    """Every QOS of the cluster and its limits."""
    with _reading():
        return {(name := entry["Name"].lower()): limits_from(f"QOS {name!r}", entry,
                                                              "sacctmgr show qos")
                for entry in _listing("show", "qos", f"format=Name,{','.join(QOS_FIELDS)}")}


def cluster_facts(user: str) -> ClusterFacts:
    """Ask the cluster (``SLURM_CONF`` or the default configuration) what ``user`` may use."""
    config = _config()
    name = config.get("ClusterName", "")
    enforce = frozenset(f for f in config.get("AccountingStorageEnforce", "").split(",")
                        if f and f != "none")
    facts = ClusterFacts(name=name, user=user, enforce=enforce, partitions=_partitions())
    try:
        facts = replace(facts, queued=queued_jobs(slurm_command(*_QUEUED, user)))
    except SlurmCommandError as error:
        facts = replace(facts, queued=None, queue_error=str(error))
    if config.get("AccountingStorageType", "").endswith("/none"):
        return replace(facts, accounting_disabled=True)
    try:
        associations = _associations(name, user)
        qos = _qos_limits()
        default = slurm_command("sacctmgr", "-n", "-P", "show", "user", user,
                                "format=defaultaccount").strip().lower() or None
    except SlurmCommandError as error:
        return replace(facts, accounting_error=str(error))
    return replace(facts, associations=associations, qos=frozenset(qos), qos_limits=qos,
                   default_account=default)
