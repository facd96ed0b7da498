"""The export scripts' contract check (tools/vla_host/vla_host/export_contract.py): a component whose I/O
does not match the contract is refused with the component, tensor, expected and found."""

import numpy as np
import pytest

from vla_host.export_contract import check_io

WANT = {"hidden_states": (1, 8, 64), "attention_bias": (1, 1, 8, 8), "hidden_out": (1, 8, 64)}


def io(**shapes):
    out = {k: np.zeros(v, np.float32) for k, v in WANT.items()}
    for k, v in shapes.items():
        if v is None:
            del out[k]
        else:
            out[k] = np.zeros(v, np.float32)
    return out


def test_the_contract_passes():
    check_io("llm_split0", io(), WANT)


@pytest.mark.parametrize("change, line", [
    ({"attention_bias": (1, 1, 8, 9)},
     "llm_split0: tensor attention_bias: expected shape [1, 1, 8, 8], found [1, 1, 8, 9]"),
    ({"hidden_out": None}, "llm_split0: tensor hidden_out: expected shape [1, 8, 64], found none"),
    ({"keys": (2, 1, 8, 32)},
     "llm_split0: unexpected tensors ['keys']: expected only ['attention_bias', 'hidden_out', 'hidden_states']"),
])
def test_a_mismatch_is_one_line_naming_component_tensor_expected_and_found(change, line):
    with pytest.raises(SystemExit) as e:
        check_io("llm_split0", io(**change), WANT)
    assert str(e.value) == line
