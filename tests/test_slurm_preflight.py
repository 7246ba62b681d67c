"""`hpcmem preflight` and the workflow's own preflight on the site-like test cluster.

The unedited template (profiles/slurm, only its SITE names set) passes on a small site's
partition of 2-CPU nodes and a 30-minute MaxTime, with images and without. A site profile
outside the checkout, set up as docs/slurm-site.md says, passes; so does the documented
`hpcmem preflight --profile hpcmem-site` from the checkout, from a $HOME holding a checkout
named hpcmem, and from an unrelated folder. Each mistake an admin
makes in it (more CPUs than a node has, an unknown partition, an unknown
QOS or one the user may not use, an account the user lacks, a QOS given twice) is one
line naming the setting and its value, exit 2, before anything is submitted; so is what
a site's wrapper in front of sinfo, scontrol or sacctmgr prints that Slurm never would
(bytes that are not UTF-8, MaxTime=abc, a line without PartitionName), naming the tool. A
job that passes the preflight but pends for ever (a QOS per-job CPU-minutes limit, which the
preflight does not check) ends the run naming it. The workflow's own preflight refuses a
run as bad input: its lines, no traceback, exit 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hostile_inputs import site_wrapper
from slurm_cluster import SlurmCluster
from slurm_site import (
    BIN,
    REPO,
    SWEEP,
    checkout_workdir,
    ensure,
    preflight,
    run_logged,
    site_profile,
    submitted_from,
)

from hpcmem.slurm.limits import QOS_FIELDS

pytestmark = pytest.mark.slurm

#: stands for one CPU more than the test cluster's node has
MORE_THAN_A_NODE = "more than a node"
#: what the preflight asks sacctmgr about every QOS
QOS_FORMAT = f"format=Name,{','.join(QOS_FIELDS)}"
#: a QOS line of sacctmgr after its name: no limit set
UNSET = b"|" * len(QOS_FIELDS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkout_workdir(tmp_path_factory.mktemp("preflight-work"))


@pytest.mark.parametrize("images", [False, True], ids=["natively", "in-images"])
def test_the_unedited_template_fits_a_small_partition(
    small_cluster: SlurmCluster, workdir: Path, tmp_path: Path, images: bool,
    request: pytest.FixtureRequest
) -> None:
    # 2-CPU nodes, MaxTime 30 minutes: the template's own figures and sweep, only its SITE
    # names set (QOS normal: the template's, without the small site's limits on bench)
    if images:
        request.getfixturevalue("apptainer")  # skips without a runtime
    sweep = yaml.safe_load((REPO / "profiles" / "slurm" / "sweep.yaml").read_text())
    sweep["container"]["enabled"] = images
    profile = site_profile(tmp_path / "hpcmem", small_cluster, sweep, unedited=True,
                           **{"slurm-qos": "normal"})
    result = preflight(small_cluster, profile, workdir)
    assert result.returncode == 0, result.stdout
    # in images: build_container, run_collectives_native and aggregate_native as well, and
    # the native comparison's points in the jobs of points
    points = 36 if images else 18
    jobs = 12 if images else 9  # in images, one build per image as well
    assert result.stdout.strip() == (
        f"hpcmem preflight: ok: {10 if images else 7} rules fit cluster 'hpcmem': partitions "
        f"batch, hbm; accounts hpc; QOS normal; {jobs} Slurm jobs (group points: {points} "
        f"points in {2 if images else 1})")


def test_a_site_profile_outside_the_tree_passes(slurm_cluster: SlurmCluster, workdir: Path,
                                                tmp_path: Path) -> None:
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP)
    assert not profile.is_relative_to(REPO)
    began = time.monotonic()
    result = preflight(slurm_cluster, profile, workdir)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == (
        "hpcmem preflight: ok: 6 rules fit cluster 'hpcmem': partitions batch, hbm; "
        "accounts hpc; QOS bench; 3 Slurm jobs")
    print(f"preflight took {time.monotonic() - began:.1f}s")


def test_the_documented_preflight_passes_from_any_folder(slurm_cluster: SlurmCluster,
                                                        tmp_path: Path) -> None:
    # docs/slurm.md: the profile copied to ~/.config/snakemake/hpcmem-site, the checkout in
    # ~/hpcmem; `hpcmem preflight --profile hpcmem-site` from the checkout (which holds the
    # package folder hpcmem/), from $HOME (which holds the checkout hpcmem) and elsewhere
    home = tmp_path / "home"
    site_profile(home / ".config" / "snakemake" / "hpcmem-site", slurm_cluster, SWEEP)
    (home / "hpcmem").symlink_to(REPO)
    (home / "elsewhere").mkdir()
    env = {key: value for key, value in slurm_cluster.env().items()
           if key not in ("XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SNAKEMAKE_PROFILE")}
    for cwd in (REPO, home, home / "elsewhere"):
        done = subprocess.run(slurm_cluster.on_login([str(BIN / "hpcmem"), "preflight",
                                                      "--profile", "hpcmem-site"]),
                              capture_output=True, text=True, timeout=300, cwd=cwd,
                              env={**env, "HOME": str(home), "PATH": f"{BIN}:{env['PATH']}"})
        assert (done.returncode, done.stderr) == (0, ""), f"from {cwd}: {done.stdout}"
        assert done.stdout.startswith("hpcmem preflight: ok: "), f"from {cwd}: {done.stdout}"


@pytest.mark.parametrize(("change", "line"), [
    ({"set-resources__build_wheel__cpus_per_task": MORE_THAN_A_NODE},
     r"cpus_per_task: (\d+) \(rule build_wheel\) is more CPUs than a node of partition "
     r"'batch' has \(at most \d+\)"),
    ({"default-resources__slurm_partition": "btach"},
     r"slurm_partition: 'btach' \(rules aggregate_results, build_wheel, check_regressions, "
     r"install_wheel, render_report\) is not a partition of cluster 'hpcmem' "
     r"\(partitions: batch, hbm\)"),
    ({"slurm-qos": "bnech"},
     r"slurm-qos: 'bnech' is not a QOS of cluster 'hpcmem' \(QOS: [a-z, ]*bench[a-z, ]*\)"),
    ({"slurm-qos": "restricted"},
     r"slurm-qos: 'restricted' is not allowed for user 'root' with account 'hpc' "
     r"\(allowed: [a-z_, ]*bench[a-z_, ]*\)"),
    ({"default-resources__slurm_account": "other"},
     r"slurm_account: 'other' \(rules .*run_collectives.*\) is not an account of user 'root' "
     r"on cluster 'hpcmem' \(accounts: [a-z, ]*hpc[a-z, ]*\)"),
    ({"set-resources__run_collectives__qos": "normal"},
     r"qos: 'normal' \(rule run_collectives\) is overridden by slurm-qos: 'bench' "
     r"\(sbatch gets --qos twice and the last one wins\): set only one"),
    ({"set-resources__aggregate_results__slurm_partition": "hbm"},
     r"slurm_partition: differs within group 'summarise' \(aggregate_results: 'hbm'; "
     r"check_regressions: 'batch'; render_report: 'batch'\) but a group is one Slurm job: "
     r"give its rules one value, or run a rule on its own \(snakemake --groups RULE=NAME\)"),
], ids=["cpus", "partition", "unknown-qos", "qos-not-allowed", "account", "qos-twice",
        "group"])
def test_each_mistake_is_one_line_naming_the_setting(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path, change: dict, line: str
) -> None:
    ensure(slurm_cluster, "account", "other", "Description=other", "Organization=other")
    ensure(slurm_cluster, "qos", "restricted")
    if MORE_THAN_A_NODE in change.values():
        cpus = slurm_cluster.run("sinfo", "-h", "-p", slurm_cluster.partition, "-o", "%c").stdout
        change = {key: int(cpus) + 1 for key in change}
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP, **change)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = preflight(slurm_cluster, profile, workdir)
    assert result.returncode == 2, result.stdout
    problems = result.stdout.splitlines()
    assert problems[-1] == "hpcmem preflight: 1 problem(s): fix them before submitting"
    assert re.fullmatch(f"hpcmem preflight: {line}", problems[0]), result.stdout
    assert submitted_from(slurm_cluster, workdir, since) == []


@pytest.mark.parametrize(("tool", "args", "prints", "line"), [
    ("sinfo", "-h -N -a -o %R|%N|%c|%m|%G|%f", b"batch|node1|4|1000|(null)|caf\xe9\n",
     "slurm: the cluster did not answer: output of `sinfo -h -N -a -o %R|%N|%c|%m|%G|%f`: not "
     "UTF-8 text (byte 0xe9 at offset 29): near b'|node1|4|1000|(null)|caf\\xe9'"),
    ("scontrol", "show partition -o", b"PartitionName=batch MaxTime=abc State=UP\n",
     "slurm: the cluster did not answer: `scontrol show partition -o` MaxTime: 'abc' is not a "
     "time limit (accepted: [days-]hours:minutes:seconds, or UNLIMITED)"),
    ("scontrol", "show partition -o", b"Partitions: batch hbm\n",
     "slurm: the cluster did not answer: `scontrol show partition -o`: 'Partitions: batch hbm' "
     "is a line without PartitionName= (accepted: one partition per line: PartitionName=NAME "
     "Key=value ...)"),
    ("sacctmgr", f"-n -P show qos {QOS_FORMAT}", b"normal%s\nbench%s\n\xff\n" % (UNSET, UNSET),
     "sacctmgr: cannot list the accounts and QOS of user 'root': output of `sacctmgr -n -P show "
     f"qos {QOS_FORMAT}`: not UTF-8 text (byte 0xff at offset 33): near b'\\xff'"),
    ("sacctmgr", f"-n -P show qos {QOS_FORMAT}",
     b"normal%s\nbench|cpu=one%s\n" % (UNSET, UNSET[1:]),
     "sacctmgr: cannot list the accounts and QOS of user 'root': sacctmgr show qos "
     "MaxTRESPerJob: 'cpu=one' is not a TRES limit (accepted: name=amount pairs separated by "
     "',', e.g. cpu=2,mem=4G)"),
], ids=["sinfo-latin1", "scontrol-maxtime", "scontrol-no-partitionname", "sacctmgr-binary",
        "sacctmgr-tres"])
def test_odd_output_of_a_site_wrapper_is_one_line_naming_the_tool(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path, tool: str, args: str,
    prints: bytes, line: str
) -> None:
    # a site's wrapper script in front of the real tool prints what Slurm never would
    wrappers = site_wrapper(tmp_path / "bin", tool, args, prints)
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = preflight(slurm_cluster, profile, workdir,
                       PATH=f"{wrappers}:{os.environ['PATH']}")
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stdout
    assert result.stdout.splitlines() == [
        f"hpcmem preflight: {line}", "hpcmem preflight: 1 problem(s): fix them before submitting"]
    assert submitted_from(slurm_cluster, workdir, since) == []


def test_the_workflow_runs_the_preflight_before_its_first_submission(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path
) -> None:
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP,
                           **{"set-resources__run_collectives__slurm_partition": "hbm2"})
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = run_logged([str(BIN / "snakemake"), "--profile", str(profile),
                         "--snakefile", str(REPO / "workflow" / "Snakefile"),
                         "--directory", str(workdir)], slurm_cluster, cwd=workdir)  # fmt: skip
    # refused as bad input: exit 2, its lines last, no traceback
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines()[-2:] == [
        "hpcmem preflight: slurm_partition: 'hbm2' (rule run_collectives) is not a partition "
        "of cluster 'hpcmem' (partitions: batch, hbm)",
        "hpcmem preflight: 1 problem(s) above: nothing was submitted; fix the profile (or the "
        "sweep) and run again"]
    assert not re.search(r"Traceback|Error\b|File \"", result.stdout), result.stdout
    assert "has been submitted" not in result.stdout
    assert submitted_from(slurm_cluster, workdir, since) == []
    assert not list((workdir / ".snakemake" / "locks").glob("*"))


def test_a_job_pending_for_ever_ends_the_run_naming_it(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path
) -> None:
    # a QOS allowing 10 CPU-minutes per job: the 2-CPU, 25-minute build job pends with
    # QOSMaxCpuMinutesPerJobLimit, a reason that never clears; the preflight does not
    # check TRES-minutes limits
    ensure(slurm_cluster, "qos", "tinymins", "MaxTRESMinsPerJob=cpu=10")
    allowed = slurm_cluster.run("sacctmgr", "-i", "modify", "user", "root", "where",
                                f"account={slurm_cluster.account}", "set", "QOS+=tinymins")
    assert allowed.returncode == 0, allowed.stderr
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP, **{
        "slurm-qos": "tinymins", "set-resources__build_wheel__cpus_per_task": 2})
    began = time.monotonic()
    result = run_logged([str(BIN / "snakemake"), "--profile", str(profile),
                         "--snakefile", str(REPO / "workflow" / "Snakefile"),
                         "--directory", str(workdir), "results/stuck/build/wheelhouse",
                         "--config", "run_id=stuck"], slurm_cluster, cwd=workdir,
                        timeout=120)  # fmt: skip
    took = time.monotonic() - began
    assert result.returncode == 1, result.stdout
    jobs = re.findall(r"has been submitted with SLURM jobid (\d+)", result.stdout)
    assert len(jobs) == 1, result.stdout
    job_id = jobs[0]
    named = (f"Slurm job {job_id} (rule_build_build_wheel) is PENDING with "  # group build
             "Reason=QOSMaxCpuMinutesPerJobLimit, which does not clear by itself")
    assert f"hpcmem watchdog: {named}: ending the run" in result.stdout
    assert f"hpcmem: the run was ended: {named}." in result.stdout
    assert took < 60, f"the run took {took:.0f}s to end"
    state = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State").stdout
    assert state.startswith("CANCELLED")  # Snakemake cancelled it on the way out
    assert not list((workdir / ".snakemake" / "locks").glob("*"))
