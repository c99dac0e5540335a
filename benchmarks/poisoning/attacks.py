"""The poisoning benchmark's attacks (``run.py`` describes them): what an attacker does to its
uplink after its honest local work, attached by wrapping the method's device half (and, for
FedProto, its server half) in this process, and the :class:`Probe` that measures what the honest
devices sent and how their training went."""

from __future__ import annotations

import numpy as np
import torch

from edgefl.algorithms import fedproto as fedproto_mod
from edgefl.algorithms import get_algorithm

#: the fleet: 10 devices, 2 of them (20 %) attackers
CLIENTS = 10
ATTACKERS = ("d00", "d01")
FACTORS = {"scale": 10.0, "signflip": -4.0, "scale_x100": 100.0}
PULL = CLIENTS / len(ATTACKERS)  # wrong_class: how far the attackers push so that the mean lands


class Probe:
    """What one cell's honest devices sent and how their training went."""

    def __init__(self):
        # per uplink (FedAvg) or per class prototype (FedProto): distance from ref
        self.sent: list[float] = []
        self.ce: list[float] = []
        self.term: list[float] = []  # the knowledge term of the loss (λ·MSE)
        # per round: mean distance of the global prototypes from honest class means
        self.proto_error: list[float] = []


def _dist(a: np.ndarray, ref: np.ndarray | None) -> float:
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a if ref is None else a - np.asarray(ref, np.float64)))


def _attack_weights(arrays: dict, received: dict, attack: str) -> None:
    factor = FACTORS[attack]
    for name, a in list(arrays.items()):
        if a.dtype.kind != "f":
            continue
        ref = received.get(name)
        ref = np.zeros_like(a) if ref is None or ref.shape != a.shape else ref.astype(a.dtype)
        arrays[name] = (ref + factor * (a - ref)).astype(a.dtype)


def _attack_logits(arrays: dict, received: dict, attack: str) -> None:
    """FedHe: per class y, the logit row (and feature row, where sent) of class y+1 (wrong_class)
    or the sign-flipped row, around what the server sent for y."""
    for name in ("logit", "feat"):
        if name not in arrays:
            continue
        own = np.asarray(arrays[name], np.float64)
        ref = np.asarray(received[name], np.float64) if name in received else np.zeros_like(own)
        if attack == "wrong_class":
            arrays[name] = (ref + PULL * (np.roll(own, -1, axis=0) - ref)).astype(np.float32)
        else:
            arrays[name] = (ref + FACTORS[attack] * (own - ref)).astype(np.float32)


def _received_protos(received: dict) -> dict[int, np.ndarray]:
    if fedproto_mod.PROTO not in received:
        return {}
    return {
        int(c): received[fedproto_mod.PROTO][i]
        for i, c in enumerate(received[fedproto_mod.PROTO_CLASSES])
    }


def _attack_protos(arrays: dict, received: dict, attack: str, num_classes: int) -> None:
    classes = [int(c) for c in arrays[fedproto_mod.PROTO_CLASSES]]
    own = dict(zip(classes, np.asarray(arrays[fedproto_mod.PROTO], np.float64), strict=True))
    refs = _received_protos(received)
    out = []
    for c in classes:
        ref = np.asarray(refs.get(c, np.zeros_like(own[c])), np.float64)
        if attack == "wrong_class":
            target = own.get((c + 1) % num_classes, own[c])
            out.append(ref + PULL * (target - ref))
        else:
            out.append(ref + FACTORS[attack] * (own[c] - ref))
    arrays[fedproto_mod.PROTO] = np.stack(out).astype(np.float32)


def install_attack(method: str, attack: str | None, probe: Probe):
    """Wrap the method's device (and, for FedProto, server) half: attackers rewrite their uplink,
    honest devices' traffic and loss terms are measured. Returns an undo function."""
    algo = get_algorithm(method)
    cls, server_cls = algo.device, algo.server
    receive, fit = cls.receive, cls.fit
    loss = getattr(cls, "loss", None)
    aggregate = server_cls.aggregate

    def attacked_receive(self, round, payload):
        self._received = {k: np.array(v) for k, v in payload.arrays.items()}
        return receive(self, round, payload)

    def attacked_fit(self, round):
        up = fit(self, round)
        received = getattr(self, "_received", {})
        if self.ctx.device_id not in ATTACKERS:
            if method == "fedhe":
                for name in ("logit",):
                    ref = received.get(name)
                    for c in np.flatnonzero(up.arrays["count"] > 0):
                        probe.sent.append(
                            _dist(
                                up.arrays[name][c],
                                None if ref is None or not received["known"][c] else ref[c],
                            )
                        )
            elif method == "fedproto":
                refs = _received_protos(received)
                for i, c in enumerate(up.arrays[fedproto_mod.PROTO_CLASSES]):
                    probe.sent.append(_dist(up.arrays[fedproto_mod.PROTO][i], refs.get(int(c))))
            else:
                probe.sent.append(
                    _dist(
                        np.concatenate(
                            [np.ravel(a) for k, a in up.arrays.items() if a.dtype.kind == "f"]
                        ),
                        np.concatenate(
                            [
                                np.ravel(received[k])
                                for k, a in up.arrays.items()
                                if a.dtype.kind == "f"
                            ]
                        )
                        if received
                        else None,
                    )
                )
            return up
        if attack is None:
            return up
        if method == "fedproto":
            _attack_protos(up.arrays, received, attack, self.ctx.num_classes)
        elif method == "fedhe":
            _attack_logits(up.arrays, received, attack)
        else:
            _attack_weights(up.arrays, received, attack)
        return up

    def probed_loss(self, x, y):
        z = self.model.features(x)
        ce = torch.nn.functional.cross_entropy(self.model.classify(z), y)
        term = self.options.lam * fedproto_mod.prototype_loss(z, y, self.protos, self.known)
        if self.ctx.device_id not in ATTACKERS:
            probe.ce.append(float(ce.detach()))
            probe.term.append(float(term.detach()))
        return ce + term

    def probed_aggregate(self, round, uplinks):
        honest = [
            fedproto_mod.unpack_prototypes(p.arrays, self.ctx.num_classes, self.dim)
            for d, p in uplinks.items()
            if d not in ATTACKERS
        ]
        out = aggregate(self, round, uplinks)
        errors = []
        for c in range(self.ctx.num_classes):
            vs = [h[c] for h in honest if c in h]
            if vs and self.table.known[c]:
                errors.append(_dist(self.table.values[c], np.mean(vs, axis=0)))
        if errors:
            probe.proto_error.append(float(np.mean(errors)))
        return out

    loss_terms = getattr(cls, "loss_terms", None)

    def probed_loss_terms(self, x, y, round):
        terms = loss_terms(self, x, y, round)
        if self.ctx.device_id not in ATTACKERS:
            probe.ce.append(float(terms.ce.detach()))
            probe.term.append(float(self.options.alpha * (terms.mse + terms.kl).detach()))
        return terms

    cls.receive, cls.fit = attacked_receive, attacked_fit
    if method == "fedproto":
        cls.loss, server_cls.aggregate = probed_loss, probed_aggregate
    if method == "fedhe":
        cls.loss_terms = probed_loss_terms

    def undo():
        cls.receive, cls.fit = receive, fit
        if method == "fedproto":
            cls.loss, server_cls.aggregate = loss, aggregate
        if method == "fedhe":
            cls.loss_terms = loss_terms

    return undo
