"""The golden generators and `goldens list` / `goldens make SET` (cli): every directory under
golden/ belongs to one set, made by its generators in the set's venv."""
