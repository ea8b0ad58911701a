"""The input-shape contract: defaults, validation, warnings and the shapes to feed."""

import copy

import pytest

from deployhub.registry.contract import (
    ContractError,
    concrete_shapes,
    contract_warnings,
    default_contract,
    validate_contract,
)

DIGITS = [{"name": "image", "dtype": "float", "shape": ["N", 3, 32, 32]}]
DYNAMIC_HW = [{"name": "image", "dtype": "float", "shape": ["N", 3, "H", "W"]}]
NHWC = [{"name": "pixels", "dtype": "uint8", "shape": [None, "H", "W", 3]}]


def contract(shape=("batch", 3, 32, 32), batch=None, dynamic=None, name="image"):
    return {
        "inputs": {
            name: {
                "shape": list(shape),
                "batch": batch or {"sizes": [1]},
                "dynamic": dynamic or {},
            }
        }
    }


def hw_ranges(low=224, opt=384, high=512):
    return {"2": {"min": low, "opt": opt, "max": high}, "3": {"min": low, "opt": opt, "max": high}}


def test_it_defaults_a_symbolic_batch_to_size_one():
    assert default_contract(DIGITS) == contract()


def test_it_keeps_a_fixed_batch_axis_as_its_only_size():
    inputs = [{"name": "image", "dtype": "float", "shape": [4, 3, 32, 32]}]

    assert default_contract(inputs)["inputs"]["image"]["batch"] == {"sizes": [4]}
    assert validate_contract(default_contract(inputs), inputs) == contract(batch={"sizes": [4]})


def test_it_leaves_dynamic_height_and_width_without_a_range():
    proposed = default_contract(DYNAMIC_HW)["inputs"]["image"]

    assert proposed["shape"] == ["batch", 3, "H", "W"]
    assert proposed["dynamic"] == {
        "2": {"min": None, "opt": None, "max": None},
        "3": {"min": None, "opt": None, "max": None},
    }
    with pytest.raises(ContractError, match=r"Dynamic axis 2 \('H'\) of 'image' needs a range"):
        validate_contract(default_contract(DYNAMIC_HW), DYNAMIC_HW)


def test_it_names_unnamed_dynamic_axes():
    proposed = default_contract(NHWC)["inputs"]["pixels"]

    assert proposed["shape"] == ["batch", "H", "W", 3]
    assert default_contract([{"name": "x", "dtype": "float", "shape": [None, None]}])["inputs"][
        "x"
    ]["shape"] == ["batch", "axis1"]


def test_it_accepts_the_demo_default_contract_unchanged():
    assert validate_contract(default_contract(DIGITS), DIGITS) == default_contract(DIGITS)


def test_it_sorts_and_deduplicates_batch_sizes():
    normalised = validate_contract(contract(batch={"sizes": [16, 1, 8, 8]}), DIGITS)

    assert normalised["inputs"]["image"]["batch"] == {"sizes": [1, 8, 16]}


def test_it_accepts_fixing_dynamic_axes_and_ranges_for_the_rest():
    fixed = validate_contract(contract(), DYNAMIC_HW)
    ranged = validate_contract(
        contract(shape=("batch", 3, "H", "W"), dynamic=hw_ranges()), DYNAMIC_HW
    )

    assert fixed["inputs"]["image"]["shape"] == ["batch", 3, 32, 32]
    assert ranged["inputs"]["image"]["dynamic"]["3"] == {"min": 224, "opt": 384, "max": 512}


def test_validation_is_idempotent_and_does_not_modify_its_argument():
    given = contract(batch={"sizes": [8, 1]})
    before = copy.deepcopy(given)

    once = validate_contract(given, DIGITS)

    assert given == before
    assert validate_contract(once, DIGITS) == once


@pytest.mark.parametrize(
    "bad, message",
    [
        (contract(name="input"), "no entry for the model input 'image'"),
        (
            {"inputs": {**contract()["inputs"], **contract(name="mask")["inputs"]}},
            "names 'mask', which is not an input of the model",
        ),
        (contract(shape=("batch", 4, 32, 32)), "fixes axis 1 of 'image' to 3; the contract says 4"),
        (contract(shape=("batch", "C", 32, 32)), "fixes axis 1 of 'image' to 3"),
        (contract(shape=("batch", 3, 32)), "has 4 axes; the contract's shape has 3"),
        (contract(shape=(1, 3, 32, 32)), 'write it as "batch"'),
        (contract(shape=("batch", 3, 0, 32)), "Axis 2 of 'image' must be a positive"),
        (contract(batch={"sizes": [0, 8]}), "positive whole numbers"),
        (contract(batch={"sizes": []}), "non-empty list"),
        (contract(batch={"sizes": [True]}), "positive whole numbers"),
        (contract(batch={"min": 8, "opt": 4, "max": 16}), "min <= opt <= max"),
        (contract(batch={"min": 1, "max": 16}), "must be"),
        (contract(dynamic={"2": {"min": 1, "opt": 1, "max": 1}}), "not a dynamic axis"),
        (contract(dynamic={"height": {"min": 1, "opt": 1, "max": 1}}), "keyed by axis number"),
        ({"image": contract()["inputs"]["image"]}, 'one key, "inputs"'),
        ({"inputs": {"image": {**contract()["inputs"]["image"], "x": 1}}}, "unknown key 'x'"),
    ],
)
def test_it_refuses_an_invalid_contract_with_its_reason(bad, message):
    with pytest.raises(ContractError, match=message):
        validate_contract(bad, DIGITS)


def test_a_dynamic_axis_needs_a_well_ordered_range():
    bad = contract(
        shape=("batch", 3, "H", "W"),
        dynamic={**hw_ranges(), "3": {"min": 512, "opt": 384, "max": 224}},
    )

    with pytest.raises(ContractError, match=r"dynamic axis 3 \('W'\).*min <= opt <= max"):
        validate_contract(bad, DYNAMIC_HW)


def test_a_fixed_model_batch_cannot_take_other_sizes():
    inputs = [{"name": "image", "dtype": "float", "shape": [1, 3, 32, 32]}]

    with pytest.raises(ContractError, match=r"fixes axis 0 \(batch\) of 'image' to 1; .* 1, 8"):
        validate_contract(contract(batch={"sizes": [1, 8]}), inputs)


def test_it_refuses_a_largest_shape_over_the_element_limit():
    big = contract(shape=("batch", 3, "H", "W"), batch={"min": 1, "opt": 8, "max": 64})
    big["inputs"]["image"]["dynamic"] = hw_ranges(high=4096)

    with pytest.raises(ContractError, match=r"\[64, 3, 4096, 4096\], has 3,221,225,472 elements"):
        validate_contract(big, DYNAMIC_HW)
    assert validate_contract(big, DYNAMIC_HW, max_elements=4 * 10**9)


def test_it_accepts_any_full_shape_when_the_model_does_not_declare_one():
    inputs = [{"name": "image", "dtype": "float", "shape": None}]

    with pytest.raises(ContractError, match="needs its full shape"):
        validate_contract(default_contract(inputs), inputs)
    assert validate_contract(contract(), inputs) == contract()


def test_it_warns_about_dynamic_height_and_width():
    dynamic = contract(shape=("batch", 3, "H", "W"), dynamic=hw_ranges())

    warnings = contract_warnings(dynamic, DYNAMIC_HW, gpu=False)

    assert warnings == [
        "Axes 2 (height) and 3 (width) of 'image' are dynamic: dynamic height/width cost speed "
        "unless the runtime gets explicit min/opt/max profiles; fix them at export and pad "
        "odd sizes."
    ]


def test_it_finds_height_and_width_of_nhwc_inputs():
    given = contract(
        shape=("batch", "H", 640, 3),
        dynamic={"1": {"min": 240, "opt": 480, "max": 480}},
        name="pixels",
    )

    warnings = contract_warnings(given, NHWC, gpu=False)

    assert len(warnings) == 1
    assert warnings[0].startswith("Axis 1 (height) of 'pixels' is dynamic: dynamic height/width")


def test_it_warns_on_gpus_about_batches_that_are_not_multiples_of_8():
    sizes = contract(batch={"sizes": [1, 4, 8, 12]})
    ranged = contract(batch={"min": 1, "opt": 8, "max": 30})

    assert contract_warnings(sizes, DIGITS, gpu=True) == [
        "The batch sizes 4, 12 of 'image' are not multiples of 8: "
        "tensor cores work on multiples of 8."
    ]
    assert contract_warnings(ranged, DIGITS, gpu=True) == [
        "The batch max 30 of 'image' is not a multiple of 8: tensor cores work on multiples of 8."
    ]
    assert contract_warnings(sizes, DIGITS, gpu=False) == []


def test_a_fixed_contract_with_batches_of_8_has_no_warnings():
    good = contract(batch={"sizes": [1, 8, 16]})

    assert contract_warnings(good, DYNAMIC_HW, gpu=True) == []


def test_concrete_shapes_use_the_first_size_or_opt():
    ranged = contract(
        shape=("batch", 3, "H", "W"),
        batch={"min": 1, "opt": 8, "max": 32},
        dynamic=hw_ranges(),
    )

    assert concrete_shapes(contract(batch={"sizes": [1, 8, 16]})) == {"image": [1, 3, 32, 32]}
    assert concrete_shapes(ranged) == {"image": [8, 3, 384, 384]}
    assert concrete_shapes(ranged, batch=32) == {"image": [32, 3, 384, 384]}


def test_concrete_shapes_refuse_a_batch_the_contract_does_not_allow():
    with pytest.raises(ContractError, match=r"Batch 4 is not allowed for 'image' \(sizes: 1, 8\)"):
        concrete_shapes(contract(batch={"sizes": [1, 8]}), batch=4)
    with pytest.raises(ContractError, match="outside 1..32"):
        concrete_shapes(contract(batch={"min": 1, "opt": 8, "max": 32}), batch=64)


def test_a_scalar_input_has_no_batch_axis():
    inputs = [{"name": "threshold", "dtype": "float", "shape": []}]

    proposed = validate_contract(default_contract(inputs), inputs)

    assert concrete_shapes(proposed) == {"threshold": []}
