"""Layouts of collectives points (nodes x tasks per node), where ranks ran, and the report's
scaling curves. The sweep across real nodes: tests/test_multinode.py."""

from __future__ import annotations

import pandas as pd
import pytest

from hpcmem.collectives.placement import placement_by_host
from hpcmem.collectives.scaling import scaling_figures
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.collectives.spread import layout_fields
from hpcmem.workflow.layout import Layout, LayoutError, sweep_layouts


@pytest.mark.parametrize(("layout", "folder"), [
    (Layout(1, 2), "ranks2"), (Layout(2, 1), "nodes2_ranks2"), (Layout(4, 56), "nodes4_ranks224"),
])
def test_a_layout_names_its_folder_and_reads_it_back(layout: Layout, folder: str) -> None:
    assert layout.folder == folder
    assert Layout.from_folder(folder) == layout


@pytest.mark.parametrize("folder", ["nodes3_ranks4", "ranks", "nodes2", "nodes0_ranks2"])
def test_a_folder_that_names_no_layout_is_refused(folder: str) -> None:
    with pytest.raises(LayoutError, match=repr(folder)):
        Layout.from_folder(folder)


def test_launch_options_follow_the_launcher() -> None:
    two = Layout(2, 2)
    assert two.launch_options("srun") == ["--nodes=2", "--ntasks-per-node=2", "--ntasks=4"]
    assert two.launch_options("/usr/bin/srun --mpi=pmix") == [
        "--nodes=2", "--ntasks-per-node=2", "--ntasks=4"]
    assert two.launch_options("mpirun --oversubscribe") == ["-n", "4", "--map-by", "ppr:2:node"]
    assert Layout(1, 2).launch_options("mpiexec") == Layout(1, 2).launch_options("srun") == [
        "-n", "2"]  # one node: the command lines of one-node points as they always were


def test_slurm_resources_set_tasks_per_node_or_tasks_never_both() -> None:
    # the executor plugin takes tasks_per_node only above 1
    assert Layout(2, 2).slurm_resources() == {"nodes": 2, "tasks_per_node": 2, "tasks": 0}
    assert Layout(2, 1).slurm_resources() == {"nodes": 2, "tasks_per_node": 0, "tasks": 2}


def test_sweep_layouts_cross_nodes_and_tasks_per_node_and_keep_ranks() -> None:
    layouts = sweep_layouts({"nodes": [1, 2], "tasks_per_node": [1, 4], "ranks": None})
    assert [layout.folder for layout in layouts] == [
        "ranks1", "ranks4", "nodes2_ranks2", "nodes2_ranks8"]
    assert sweep_layouts({"nodes": [1], "tasks_per_node": [2], "ranks": [4, 8]}) == [
        Layout(1, 4), Layout(1, 8)]
    with pytest.raises(LayoutError, match=r"config collectives.ranks: \[4\] is the one-node "
                                          r"form and nodes is \[1, 2\]"):
        sweep_layouts({"nodes": [1, 2], "tasks_per_node": [2], "ranks": [4]})
    with pytest.raises(LayoutError, match=r"config collectives.tasks_per_node: \[0\]: a list"):
        sweep_layouts({"nodes": [1], "tasks_per_node": [0], "ranks": None})


def test_where_ranks_ran_is_counted_from_their_hosts() -> None:
    assert layout_fields(["b", "a", "a", "b", "c"]) == {
        "nodes": 3, "tasks_per_node": 2, "hosts": ["a", "b", "c"]}
    page = {"nodes": {"0": 2}, "hbw_fraction": 0.0, "emulated": False}
    hbw = {"nodes": {"1": 4}, "hbw_fraction": 1.0, "emulated": True}
    by_host = placement_by_host([[page, None], [hbw, page], [page, page]], ["a", "b", "a"])
    assert by_host == {"a": {"nodes": {"0": 6}, "hbw_fraction": 0.0},
                       "b": {"nodes": {"0": 2, "1": 4}, "hbw_fraction": 4 / 6}}


def test_one_node_keys_stay_as_before_and_several_nodes_add_a_part() -> None:
    record = {"op": "allreduce", "buffer": "numpy", "dtype": "float32", "ranks": 4,
              "binding": {"name": "cores"}, "size_bytes": 8}
    one = COLLECTIVES.point_key(COLLECTIVES.coordinates_of(record))
    assert one == "collectives/allreduce/numpy/float32/ranks=4/binding=cores/size=8"
    assert COLLECTIVES.point_key(COLLECTIVES.coordinates_of({**record, "nodes": 1})) == one
    two = COLLECTIVES.point_key(COLLECTIVES.coordinates_of({**record, "nodes": 2}))
    assert two == "collectives/allreduce/numpy/float32/ranks=4/nodes=2/binding=cores/size=8"


def points(nodes: list[int]) -> pd.DataFrame:
    rows = [{"op": "allreduce", "dtype": "float32", "buffer": "numpy", "binding": "cores",
             "nodes": n, "ranks": 2 * n, "size_bytes": size,
             "latency_us.avg": 10.0 * n + size, "busbw_GBps": size / (10.0 * n + size)}
            for n in nodes for size in (8, 64, 1024)]
    return pd.DataFrame(rows)


def test_scaling_curves_are_drawn_only_for_several_node_counts() -> None:
    (figure,) = scaling_figures(points([1, 2, 4]))
    assert figure.startswith("<figure><img src=\"data:image/png;base64,")
    assert "against node count (numpy, cores, 2 ranks per node)" in figure
    assert list(scaling_figures(points([2]))) == []
