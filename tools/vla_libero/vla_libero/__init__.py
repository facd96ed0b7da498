"""LIBERO as the robot on the other side of vlad's rings (workstation tool, own venv:
scripts/setup_libero.sh; run with scripts/vla-libero)."""
