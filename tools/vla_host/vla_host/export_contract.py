"""The check every export script runs on a component before it writes it: the contract's
I/O (docs/bundle-format.md) present with the expected shapes and nothing else, else one
line naming the component, the tensor, what was expected and what was found. No torch:
the export scripts and CI's tests share it."""

from __future__ import annotations


def check_io(component: str, got: dict, want: dict) -> None:
    """`got`: tensor name -> array (anything with `.shape`); `want`: name -> shape."""
    for name, shape in want.items():
        if name not in got:
            raise SystemExit(f"{component}: tensor {name}: expected shape {list(shape)}, found none")
        if list(got[name].shape) != list(shape):
            raise SystemExit(f"{component}: tensor {name}: expected shape {list(shape)}, "
                             f"found {list(got[name].shape)}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise SystemExit(f"{component}: unexpected tensors {extra}: expected only {sorted(want)}")
