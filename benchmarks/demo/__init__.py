"""The demo (``make demo``) and what measured it."""

#: The demo's fleet: Velo over 20 devices, 12 rounds, Fashion-MNIST split Dir(0.5); what the budget
#: sweep (``tune.py``) and the in-memory scaling benchmark (``benchmarks/scale/parallel.py``) run.
FLEET = {
    "algorithm": "velo",
    "dataset": "fashion-mnist",
    "clients": 20,
    "rounds": 12,
    "partition": "dirichlet",
    "alpha": 0.5,
}
