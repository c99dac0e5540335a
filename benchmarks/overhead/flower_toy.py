"""The overhead benchmark's toy workload in Flower's simulation engine (run in the Flower venv).

Same workload as edgefl's ``bench-echo``: every client returns the array it was sent (no local
work), FedAvg averages the replies. Per round we time configure_train → aggregate_train (the
whole train round of ``Strategy.start``); client-side evaluation is off (fraction_evaluate=0).

    .venv-flower/bin/python flower_toy.py --clients 10 --rounds 6 --floats 1000 --out result.json

Flower waits on two timers: the in-memory grid sleeps ``pull_interval`` (0.1 s) between looks for
replies (``InMemoryGrid.send_and_receive``), and the simulation engine's feeder thread waits a
hard-coded 0.1 s between looks for new instructions (``add_messages_to_queue`` in
``flwr.server.superlink.fleet.vce.vce_api``). ``--pull-interval S`` sets the grid's attribute;
``--engine-poll S`` replaces the feeder with the same loop waiting S seconds. Without them Flower
runs with its defaults. This script runs in Flower's own venv, never imports edgefl.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

MARKS: list[dict] = []


class TimedFedAvg(FedAvg):
    def configure_train(self, server_round, arrays, config, grid):
        MARKS.append({"round": server_round, "start": time.perf_counter()})
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        out = super().aggregate_train(server_round, replies)
        MARKS[-1].update(end=time.perf_counter(), replies=len(replies))
        return out


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    # trivial local work: echo the arrays
    content = RecordDict(
        {"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content=content, reply_to=msg)


def tune_engine(seconds: float) -> None:
    """Flower's feeder loop (flwr 1.42, vce_api.add_messages_to_queue), waiting ``seconds``."""
    from flwr.server.superlink.fleet.vce import vce_api

    def add_messages_to_queue(state, queue, nodes_mapping, f_stop):
        while not f_stop.is_set():
            for node_id in nodes_mapping.keys():
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            f_stop.wait(seconds)

    vce_api.add_messages_to_queue = add_messages_to_queue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--floats", type=int, default=1000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pull-interval", type=float, help="the grid's pull_interval (default 0.1)")
    ap.add_argument("--engine-poll", type=float, help="the engine feeder's wait (default 0.1)")
    args = ap.parse_args()
    if args.engine_poll is not None:
        tune_engine(args.engine_poll)

    server_app = ServerApp()

    @server_app.main()
    def serve(grid: Grid, context: Context) -> None:
        if args.pull_interval is not None:
            grid.pull_interval = args.pull_interval
        pull_interval = getattr(grid, "pull_interval", None)
        MARKS.append({"pull_interval": pull_interval})
        strategy = TimedFedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=args.clients,
            min_available_nodes=args.clients,
        )
        initial = np.random.default_rng(0).standard_normal(args.floats).astype(np.float32)
        strategy.start(grid=grid, initial_arrays=ArrayRecord([initial]), num_rounds=args.rounds)

    t0 = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": os.cpu_count() or 1, "object_store_memory": 2 * 1024**3},
        },
    )
    wall = time.perf_counter() - t0
    rounds = [
        {"round": m["round"], "round_seconds": m["end"] - m["start"], "replies": m["replies"]}
        for m in MARKS
        if "end" in m
    ]
    import flwr
    from flwr.server.superlink.fleet.vce import vce_api

    result = {
        "flwr": flwr.__version__,
        "clients": args.clients,
        "floats": args.floats,
        "rounds": rounds,
        "wall_seconds": wall,
        "grid_pull_interval": next(
            (m["pull_interval"] for m in MARKS if "pull_interval" in m), None
        ),
        "engine_poll": args.engine_poll,
        "engine_patched": vce_api.add_messages_to_queue.__module__ == "__main__",
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
