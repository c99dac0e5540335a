"""A run's method: the registered algorithm, its options parsed once, and what it needs from
the run (its :class:`~edgefl.algorithms.base.MethodNeeds` declaration, with the run's
``public_fraction`` over the share it declares), with the ``dp*`` options every method takes
and the ``secagg*`` options of weight methods.

    cfg, method = configure(explicit)   # a command's settings → the run configuration and method
    method.total_rounds(cfg.rounds)     # its training rounds and the method's closing rounds
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError
from edgefl.privacy import PrivacySettings, Release, split_privacy_options
from edgefl.privacy.secagg import SecAggSettings, split_secagg_options
from edgefl.privacy.secagg_halves import check_secagg

if TYPE_CHECKING:
    from edgefl.algorithms import Algorithm, MethodNeeds
    from edgefl.algorithms.aggregate import Defences
    from edgefl.config import RunConfig


@dataclass(frozen=True)
class Method:
    """A registered algorithm with its parsed options and what it needs from this run."""

    algorithm: Algorithm
    options: Any
    needs: MethodNeeds
    #: Differential privacy (the ``dp*`` options every method takes; off by default).
    privacy: PrivacySettings = PrivacySettings()
    #: Secure aggregation (the ``secagg*`` options of weight methods; off by default).
    secagg: SecAggSettings = SecAggSettings()
    #: Privacy noise drawn from the run seed, so that a simulation repeats (the simulations set it);
    #: a real device and a real server draw it from their own entropy.
    repeatable_noise: bool = False

    @property
    def name(self) -> str:
        return self.algorithm.name

    def options_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.options), **self.privacy.as_options(),
                **self.secagg.as_options()}

    @property
    def defences(self) -> Defences:
        """The server's combining rule and bound on a contribution that these options ask for
        (the plain mean and no bound where the method offers none)."""
        from edgefl.algorithms.aggregate import defences_of  # the registry imports torch

        return defences_of(self.options)

    @property
    def release(self) -> Release | None:
        """What the method's devices send, as its device half declares it for these options."""
        return self.algorithm.device.privacy_release(self.options)

    def total_rounds(self, rounds: int) -> int:
        """A run's exchanges: its training rounds and the closing rounds the method declares."""
        from edgefl.algorithms.base import total_rounds

        return total_rounds(rounds, self.needs.closing_rounds)


def resolve_method(name: str, raw_options: dict[str, Any],
                   public_share: float | None = None) -> Method:
    """The method ``name`` with ``raw_options`` parsed and its needs declared; ``public_share``
    (the run's ``public_fraction`` setting) overrides the share the method declares."""
    from edgefl.algorithms import get_algorithm

    return _method(get_algorithm(name), raw_options, public_share)


def configure(explicit: dict[str, Any]) -> tuple[RunConfig, Method]:
    """Settings given explicitly (a command's flags, a config file) → the validated run
    configuration over the algorithm's defaults, and its method: the algorithm is looked up and
    its options parsed once, here. ``simulate`` and ``serve`` take the method as it is."""
    from edgefl.algorithms import get_algorithm
    from edgefl.config import RunConfig, resolve_config

    algorithm = get_algorithm(explicit.get("algorithm",
                                           RunConfig.model_fields["algorithm"].default))
    cfg = resolve_config(explicit, dict(algorithm.defaults))
    return cfg, _method(algorithm, cfg.options, cfg.public_fraction)


def _method(algorithm: Algorithm, raw_options: dict[str, Any],
            public_share: float | None) -> Method:
    name = algorithm.name
    own, privacy = split_privacy_options(raw_options)
    own, secagg = split_secagg_options(own)
    options = algorithm.parse_options(own)
    needs = algorithm.needs_for(options)
    if public_share is not None and public_share != needs.public_share:
        if needs.devices_hold_public and public_share <= 0:
            raise ConfigError(
                f"{name} with these options has devices hold the public pool: public_fraction "
                "must be > 0")
        needs = dataclasses.replace(needs, public_share=public_share)
    method = Method(algorithm, options, needs, privacy, secagg)
    if secagg.on:
        check_secagg(name, method.release, method.defences, privacy)
    if privacy.on:
        from edgefl.privacy.seam import check_release

        check_release(name, method.release, privacy, sgd_ready=algorithm.device.dp_sgd_ready)
    return method


def registered_methods() -> list[tuple[str, MethodNeeds]]:
    """Every registered method with its declared needs at its default options."""
    from edgefl.algorithms import algorithm_names, get_algorithm

    out = []
    for name in algorithm_names():
        algorithm = get_algorithm(name)
        out.append((name, algorithm.needs_for(algorithm.parse_options({}))))
    return out


def weight_methods() -> list[str]:
    """The registered methods whose server averages weights with their default options."""
    return [name for name, needs in registered_methods() if needs.averages_weights]
