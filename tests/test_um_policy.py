"""Unified Memory policies: presets, YAML files, validation errors (CPU only)."""

from __future__ import annotations

import pytest

from hpcmem.um import PRESETS, Policy, PolicyError, TypePolicy, load_policy, policy_from_dict


def test_presets_are_the_three_named_schemes():
    assert set(PRESETS) == {"cuda", "um", "hpcmem"}
    assert PRESETS["cuda"].allocator == "cuda" and not PRESETS["cuda"].managed
    um = PRESETS["um"]
    assert um.managed
    assert all(not um.type_policy(t).has_advice() for t in ("params", "activations", "inputs"))


def test_hpcmem_preset_reads_inputs_in_place_and_keeps_the_rest_on_the_gpu():
    hp = PRESETS["hpcmem"]
    on_gpu = TypePolicy("gpu", ("gpu",), False, "on_alloc")
    assert hp.params == on_gpu
    assert hp.activations == on_gpu
    assert hp.inputs == TypePolicy("cpu", ("gpu",), False, "on_alloc")
    assert hp.priority == ("activations", "params", "inputs")


@pytest.mark.parametrize("name", ["cuda", "um", "hpcmem"])
def test_yaml_round_trip_of_each_preset(tmp_path, name):
    path = tmp_path / f"{name}-copy.yaml"
    path.write_text(PRESETS[name].to_yaml())
    assert load_policy(path) == PRESETS[name]
    assert load_policy(str(path)).to_record() == PRESETS[name].to_record()


def test_custom_yaml_file_with_defaults_and_priority(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "priority: [activations, params, inputs]\n"
        "params: {preferred_location: cpu, accessed_by: [gpu, cpu], prefetch: before_use}\n"
        "inputs: {read_mostly: true}\n"
    )
    policy = load_policy(path)
    assert policy.name == "mine"  # the file's stem
    assert policy.priority == ("activations", "params", "inputs")
    assert policy.params == TypePolicy("cpu", ("gpu", "cpu"), False, "before_use")
    assert policy.activations == TypePolicy()
    assert policy.inputs.read_mostly is True
    record = policy.to_record()
    assert record["params"]["accessed_by"] == ["gpu", "cpu"]
    assert set(record) == {"name", "allocator", "priority", "params", "activations", "inputs"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"inputs": {"prefetch": "sometimes"}},
            "policy.inputs.prefetch: 'sometimes' is not one of none, on_alloc, before_use",
        ),
        (
            {"activations": {"prefetch": "before_use"}},
            "policy.activations.prefetch: 'before_use' is not one of none, on_alloc",
        ),
        (
            {"params": {"preferred_location": "hbm"}},
            "policy.params.preferred_location: 'hbm' is not one of gpu, cpu, none",
        ),
        (
            {"params": {"accessed_by": ["gpu", "nic"]}},
            "policy.params.accessed_by: 'nic' is not one of gpu, cpu",
        ),
        ({"params": {"accessed_by": "gpu"}}, "policy.params.accessed_by: 'gpu' must be a list"),
        (
            {"inputs": {"accessed_by": ["cpu", "cpu"]}},
            "policy.inputs.accessed_by: ['cpu', 'cpu'] lists a location twice",
        ),
        (
            {"inputs": {"read_mostly": "often"}},
            "policy.inputs.read_mostly: 'often' is not one of true, false",
        ),
        ({"params": {"colour": "red"}}, "policy.params: key: 'colour' is not one of"),
        ({"weights": {}}, "policy: key: 'weights' is not one of name, allocator, priority"),
        ({"priority": ["params", "inputs"]}, "policy.priority: ['params', 'inputs'] must list"),
        ({"priority": ["params", "grads", "inputs"]}, "policy.priority: 'grads' is not one of"),
        ({"allocator": "rmm"}, "policy.allocator: 'rmm' is not one of managed, cuda"),
        (
            {"allocator": "cuda", "params": {"preferred_location": "gpu"}},
            "policy.params: advice needs allocator: managed",
        ),
        ({"params": [1, 2]}, "policy.params: [1, 2] must be a mapping"),
    ],
)
def test_validation_names_field_value_and_accepted_values(data, message):
    with pytest.raises(PolicyError) as error:
        policy_from_dict({"name": "t", **data})
    assert str(error.value).startswith(message)


def test_policy_errors_are_value_errors_and_dataclass_is_checked_too():
    with pytest.raises(ValueError, match=r"policy\.name"):
        Policy(name="")
    with pytest.raises(PolicyError, match=r"policy.inputs.prefetch: 'later'"):
        Policy(name="x", inputs=TypePolicy(prefetch="later"))


def test_unknown_name_and_bad_yaml(tmp_path):
    with pytest.raises(PolicyError, match=r"unknown policy 'fast': not one of cuda, hpcmem, um"):
        load_policy("fast")
    bad = tmp_path / "bad.yaml"
    bad.write_text("params: {preferred_location: [gpu\n")
    with pytest.raises(PolicyError, match=r"bad\.yaml:2: not valid YAML"):
        load_policy(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(PolicyError, match="policy: None must be a mapping"):
        load_policy(empty)


def test_wants_gpu_decides_budget_membership():
    assert TypePolicy("gpu").wants_gpu()
    assert TypePolicy("none", prefetch="on_alloc").wants_gpu()
    assert not TypePolicy("cpu", ("gpu",), prefetch="on_alloc").wants_gpu()
    assert not TypePolicy().wants_gpu()
