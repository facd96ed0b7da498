"""The RAUC/power-cut VM's vCPU count (scripts/rauc/vm.py): 2 unless VLA_VM_CPUS says
otherwise, and a value that is no positive whole number refused in one line naming it."""

from pathlib import Path

import pytest

import vm  # noqa: E402


def smp(cmd: list[str]) -> str:
    return cmd[cmd.index("-smp") + 1]


def test_two_vcpus_unless_asked(monkeypatch):
    monkeypatch.delenv("VLA_VM_CPUS", raising=False)
    assert vm.cpus_from_env() == 2
    assert smp(vm.qemu_command(Path("/k"), Path("/i"), Path("/w"))) == "2"
    monkeypatch.setenv("VLA_VM_CPUS", "")
    assert vm.cpus_from_env() == 2


def test_one_vcpu_from_the_environment(monkeypatch):
    monkeypatch.setenv("VLA_VM_CPUS", "1")
    assert smp(vm.qemu_command(Path("/k"), Path("/i"), Path("/w"))) == "1"
    assert smp(vm.qemu_command(Path("/k"), Path("/i"), Path("/w"), cpus=3)) == "3"


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_count_is_named(monkeypatch, value):
    monkeypatch.setenv("VLA_VM_CPUS", value)
    with pytest.raises(vm.VmError) as e:
        vm.cpus_from_env()
    assert "VLA_VM_CPUS" in str(e.value) and value in str(e.value) and "\n" not in str(e.value)
