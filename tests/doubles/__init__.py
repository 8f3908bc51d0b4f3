"""Test doubles, kept out of the wheel: a simulated MIG GPU (NVIDIA's rules), pynvml's MIG calls backed by it, and
synthetic gate histories. Tests import them from here (tests/ is on sys.path); studies/ adds tests/ to it."""
