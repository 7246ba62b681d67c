"""Layouts of collectives points (nodes x tasks per node), where ranks ran, and the report's
scaling curves. The sweep across real nodes: tests/test_multinode.py."""

from __future__ import annotations

import pandas as pd
import pytest

from hpcmem.collectives.placement import placement_by_host
from hpcmem.collectives.scaling import scaling_figures
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.collectives.spread import layout_fields
from hpcmem.workflow.layout import Layout, LayoutError


@pytest.mark.parametrize(("nodes", "ranks", "layout"), [
    (1, 2, Layout(1, 2)), (2, 2, Layout(2, 1)), (4, 224, Layout(4, 56)),
])
def test_a_point_s_ranks_spread_evenly_over_its_nodes(nodes: int, ranks: int, layout: Layout
                                                      ) -> None:  # fmt: skip
    assert Layout.spread(nodes=nodes, ranks=ranks) == layout
    assert (layout.nodes, layout.ranks) == (nodes, ranks)


@pytest.mark.parametrize(("nodes", "ranks"), [(3, 4), (0, 2), (2, 0)])
def test_ranks_that_do_not_fill_the_nodes_evenly_are_refused(nodes: int, ranks: int) -> None:
    with pytest.raises(LayoutError, match=f"ranks={ranks}, nodes={nodes}: the ranks do not "
                                          "fill the nodes evenly"):
        Layout.spread(nodes=nodes, ranks=ranks)


def test_launch_options_follow_the_launcher() -> None:
    two = Layout(2, 2)
    assert two.launch_options("srun") == ["--nodes=2", "--ntasks-per-node=2", "--ntasks=4"]
    assert two.launch_options("/usr/bin/srun --mpi=pmix") == [
        "--nodes=2", "--ntasks-per-node=2", "--ntasks=4"]
    assert two.launch_options("mpirun --oversubscribe") == ["-n", "4", "--map-by", "ppr:2:node"]
    assert Layout(1, 2).launch_options("mpiexec") == Layout(1, 2).launch_options("srun") == [
        "-n", "2"]  # one node: the command lines of one-node points as they always were


def test_slurm_resources_are_nodes_and_tasks_per_node_above_one() -> None:
    # the executor plugin takes tasks_per_node only above 1 (and never with tasks), so the
    # largest of each over grouped points is a request the plugin takes and every point fits
    assert Layout(2, 4).slurm_resources() == {"nodes": 2, "tasks_per_node": 4}
    assert Layout(2, 1).slurm_resources() == {"nodes": 2, "tasks_per_node": 2}
    assert Layout(1, 1).slurm_resources() == {"nodes": 1, "tasks_per_node": 2}


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
