"""Model rollout: exported ONNX models go to devices as versioned messages with a digest; the
device checks, installs atomically, keeps the previous version and reports the active one.

Operator side (``edgefl deploy``)::

    publish_deploy(address, "lab", "pi-07", Path("onnx/pi-07.int8.onnx"), version="lab-2026-11-23")
    publish_rollback(address, "lab", "pi-07")

Device side (``edgefl device agent``, or ``edgefl train --models-dir`` once its run is over)::

    store = ModelStore(Path("~/.local/share/edgefl/models").expanduser())
    run_agent(address, "lab", "pi-07", store)           # until interrupted
    store.active_path()                                 # what `edgefl infer` runs without a model

Messages travel on ``edgefl/<fleet>/devices/<id>/model`` (retained, so a device that was offline
gets the latest command when it connects; only the server and operator accounts may write it).
Each is one safetensors blob: the model's bytes as a uint8 tensor ``model`` (none for a rollback)
and string metadata validated by :class:`ModelCommand` (strict pydantic) before anything else is
read. The device refuses a model whose SHA-256 differs from the announced digest, that ONNX
Runtime cannot load, or whose input shape differs from the announced one or from the model it
replaces; it keeps serving the model it has and reports why. Its report, retained JSON on
``devices/<id>/active``, names the active version and digest (and the refusal, if any);
``edgefl fleet status`` shows it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefl.errors import ConfigError, EdgeflError, WireError
from edgefl.wire.schema import SESSION_HEX, device_status
from edgefl.wire.validate import parse_active, parse_status

log = logging.getLogger(__name__)

DEFAULT_MODELS_DIR = "~/.local/share/edgefl/models"
KEEP_VERSIONS = 3  # the active model and two earlier ones stay on disk
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$"


class RolloutError(EdgeflError):
    """A model command that the device refuses (it keeps the model it has)."""


def models_dir(path: str | Path | None = None) -> Path:
    return Path(path or os.environ.get("EDGEFL_MODELS_DIR") or DEFAULT_MODELS_DIR).expanduser()


class ModelCommand(BaseModel):
    """The metadata of a model message; every field typed and bounded."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    action: Literal["deploy", "rollback"]
    fleet: str = Field(pattern=r"^[^+#/]{1,64}$")
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    command_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    version: str | None = Field(default=None, pattern=_NAME)
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    tier: str = Field(default="", max_length=64)
    format: Literal["fp32", "int8", ""] = ""
    input_shape: list[int] | None = Field(default=None, max_length=8)
    size: int | None = Field(default=None, ge=1)


# --- the message ---------------------------------------------------------------------------------


def encode_command(command: ModelCommand, model: bytes | None = None) -> bytes:
    import safetensors.numpy

    tensors = {"model": np.frombuffer(model, dtype=np.uint8)} if model is not None else {}
    meta = {"edgefl.model_command": command.model_dump_json()}
    if not tensors:  # safetensors needs at least a header; an empty body is fine
        tensors = {"none": np.zeros(0, dtype=np.uint8)}
    return safetensors.numpy.save(tensors, metadata=meta)


def decode_command(data: bytes, max_bytes: int) -> tuple[ModelCommand, bytes | None]:
    """The command and the model bytes; :class:`RolloutError` for anything malformed."""
    import safetensors.numpy

    if len(data) > max_bytes:
        raise RolloutError(f"a model message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        header_len = int.from_bytes(data[:8], "little")
        if len(data) < 8 or header_len > 65536:
            raise RolloutError(f"a model message header of {header_len} bytes (at most 65536)")
        arrays = safetensors.numpy.load(data)  # the package checks the layout
        meta = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
        command = ModelCommand.model_validate_json(meta.get("edgefl.model_command", ""))
    except RolloutError:
        raise
    except ValidationError as e:
        first = e.errors()[0]
        raise RolloutError(
            f"invalid model command: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        ) from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own types; all mean "malformed"
        raise RolloutError(f"malformed model message: {type(e).__name__}: {e}") from None
    model = arrays.get("model")
    if command.action == "deploy":
        if model is None or model.dtype != np.uint8 or model.ndim != 1:
            raise RolloutError("a deploy message carries no model bytes")
        if command.version is None or command.digest is None or command.input_shape is None:
            raise RolloutError("a deploy message must name its version, digest and input shape")
        return command, model.tobytes()
    return command, None


# --- the device's store --------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)  # atomic: a crash leaves the old file or the new one, never half of one


def input_shape_of(model: bytes | Path) -> list[int]:
    """(C, H, W) of the model's one input, from ONNX Runtime (loading it is the check)."""
    from edgefl.inference import open_session

    session = open_session(model if isinstance(model, bytes) else Path(model))
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise RolloutError(
            f"the model has {len(inputs)} inputs; a classifier takes one image tensor"
        )
    dims = inputs[0].shape[1:]
    if not all(isinstance(d, int) for d in dims):
        raise RolloutError(f"the model's input shape {inputs[0].shape} is not fixed")
    return [int(d) for d in dims]


class ModelStore:
    """``dir/versions/<version>.onnx`` and ``dir/active.json`` (active entry, earlier entries)."""

    def __init__(self, directory: Path, expected_input_shape: list[int] | None = None):
        self.dir = Path(directory)
        self.expected_input_shape = expected_input_shape
        self.lock = threading.Lock()

    @property
    def state_path(self) -> Path:
        return self.dir / "active.json"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {"active": None, "previous": [], "last_command": None}
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{self.state_path} is unreadable: {e}") from None

    def active(self) -> dict[str, Any] | None:
        return self.state().get("active")

    def active_path(self) -> Path:
        entry = self.active()
        if entry is None:
            raise ConfigError(
                f"no model is installed in {self.dir} (edgefl deploy puts one there); or give a "
                "model file"
            )
        return self.dir / "versions" / f"{entry['version']}.onnx"

    def _save(self, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.state_path, json.dumps(state, indent=1, sort_keys=True).encode())

    def install(self, command: ModelCommand, model: bytes) -> dict[str, Any]:
        """Check ``model`` against ``command`` and make it the active version; the old one is
        kept."""
        digest = hashlib.sha256(model).hexdigest()
        if digest != command.digest:
            raise RolloutError(
                f"digest mismatch for version {command.version}: announced "
                f"{command.digest[:12]}…, received {digest[:12]}…"
            )
        try:
            shape = input_shape_of(model)
        except EdgeflError as e:
            raise RolloutError(
                f"version {command.version} does not load in ONNX Runtime: {e}"
            ) from None
        if shape != list(command.input_shape):
            raise RolloutError(
                f"version {command.version} takes input {shape}, not the announced "
                f"{list(command.input_shape)}"
            )
        with self.lock:
            state = self.state()
            current = state.get("active")
            expected = self.expected_input_shape or (current or {}).get("input_shape")
            if expected is not None and shape != list(expected):
                raise RolloutError(
                    f"version {command.version} takes input {shape}; this device's model takes "
                    f"{list(expected)}"
                )
            versions = self.dir / "versions"
            versions.mkdir(parents=True, exist_ok=True)
            _atomic_write(versions / f"{command.version}.onnx", model)
            entry = {"version": command.version, "digest": digest, "tier": command.tier,
                     "format": command.format, "input_shape": shape, "installed_at": time.time()}
            previous = [
                e
                for e in ([current] if current else []) + state.get("previous", [])
                if e["version"] != command.version
            ]
            state = {"active": entry, "previous": previous[: KEEP_VERSIONS - 1],
                     "last_command": command.command_id}
            self._save(state)
            self._prune(state)
        return entry

    def rollback(self, command: ModelCommand) -> dict[str, Any]:
        """Make the previous version active again (or the named earlier one)."""
        with self.lock:
            state = self.state()
            previous = state.get("previous", [])
            pick = next((e for e in previous if command.version in (None, e["version"])), None)
            if pick is None:
                raise RolloutError(
                    f"no earlier version {command.version or ''} to return to".replace("  ", " ")
                )
            if not (self.dir / "versions" / f"{pick['version']}.onnx").is_file():
                raise RolloutError(f"version {pick['version']} is no longer on this device")
            rest = [e for e in previous if e is not pick]
            state = {"active": pick, "previous": rest, "last_command": command.command_id}
            # the rolled-back-from version is dropped: a rollback is not undone by another
            self._save(state)
        return pick

    def _prune(self, state: dict[str, Any]) -> None:
        keep = {e["version"] for e in [state["active"], *state["previous"]] if e}
        for f in (self.dir / "versions").glob("*.onnx"):
            if f.stem not in keep:
                f.unlink(missing_ok=True)

    def apply(self, command: ModelCommand, model: bytes | None) -> dict[str, Any]:
        """Run a command unless it was the last one applied (retained messages come again on
        reconnect)."""
        state = self.state()
        if state.get("last_command") == command.command_id:
            return self.report()
        if command.action == "deploy":
            self.install(command, model or b"")
        else:
            self.rollback(command)
        return self.report()

    def report(self, error: str | None = None) -> dict[str, Any]:
        state = self.state()
        active = state.get("active") or {}
        out = {"version": active.get("version"), "digest": active.get("digest"),
               "tier": active.get("tier"), "format": active.get("format"),
               "previous": [e["version"] for e in state.get("previous", [])], "time": time.time()}
        if error:
            out["error"] = error
        return out


# --- over MQTT ---------------------------------------------------------------------------------


def _connect(address, client_id: str, fleet: str, on_message=None, subscribe: tuple[str, ...] = (),
             will: tuple[str, bytes] | None = None):
    from edgefl.transport.mqtt import Endpoint, Topics

    class _Conn(Endpoint):
        def subscriptions(self):
            return list(subscribe)

        def on_message(self, topic, data):
            if on_message is not None:
                on_message(topic, data)

    return _Conn(address, client_id, Topics(fleet), will=will)


def run_agent(address, fleet: str, device_id: str, store: ModelStore, *,
              max_bytes: int = 256 * 1024 * 1024, stop: threading.Event | None = None,
              say: Callable[[str], None] | None = None) -> None:
    """Serve model commands for ``device_id`` until ``stop`` is set (or interrupted). Every install,
    rollback and refusal is one line through ``say`` (default: the log at INFO)."""
    from edgefl.transport.mqtt import Topics

    say = say or (lambda line: log.info("device %s: %s", device_id, line))
    topics = Topics(fleet)
    stop = stop or threading.Event()
    report_topic = topics.device(device_id, "active")
    conn = None

    def publish_report(error: str | None = None) -> None:
        conn.publish(report_topic, json.dumps(store.report(error)).encode(), retain=True)

    def on_message(topic: str, data: bytes) -> None:
        if not data:
            return
        try:
            command, model = decode_command(data, max_bytes)
            if command.device_id != device_id or command.fleet != fleet:
                raise RolloutError(
                    f"a model command for {command.device_id!r} in fleet {command.fleet!r}"
                )
            before = (store.active() or {}).get("version")
            store.apply(command, model)
            after = (store.active() or {}).get("version")
            if command.action == "rollback":
                say(
                    f"rolled back from {before} to {after}"
                    if before != after
                    else f"rollback: {after} stays active"
                )
            elif before != after:
                say(f"installed {after} ({command.format or 'onnx'}, {command.size} bytes, "
                    f"sha256 {command.digest[:12]}…; previous: {before})")
            else:
                say(f"{after} is already active")
            publish_report()
        except (RolloutError, ConfigError) as e:
            say(f"refused a model command: {e} (active: {(store.active() or {}).get('version')})")
            publish_report(str(e))

    # the agent's own status topic says whether it is connected (its Last Will: offline), so that
    # `edgefl deploy` can tell an offline device from one that did not answer; not the training
    # process's `status`, where the server would read the agent's session as a restarted device
    status_topic = topics.device(device_id, "agent")
    session = secrets.token_hex(SESSION_HEX // 2)
    conn = _connect(address, f"edgefl-{fleet}-{device_id}-agent", fleet, on_message,
                    (topics.device(device_id, "model"),),
                    will=(status_topic, device_status("offline", session)))

    def on_connected() -> None:
        conn.publish(status_topic, device_status("online", session), retain=True)
        publish_report()

    conn.on_connected = on_connected
    conn.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if conn.connected.is_set():  # a clean exit: no Last Will, so say it
            conn.client.publish(
                status_topic, device_status("offline", session), qos=1, retain=True
            ).wait_for_publish(2.0)
        conn.stop()


def deploy_command(
    fleet: str, device_id: str, model: bytes, *, version: str, tier: str = "", fmt: str = ""
) -> ModelCommand:
    try:
        return ModelCommand(action="deploy", fleet=fleet, device_id=device_id,
                            command_id=uuid.uuid4().hex, version=version,
                            digest=hashlib.sha256(model).hexdigest(), tier=tier, format=fmt,
                            input_shape=input_shape_of(model), size=len(model))
    except ValidationError as e:
        raise ConfigError(
            f"invalid deployment: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}"
        ) from None


def rollback_command(fleet: str, device_id: str, version: str | None = None) -> ModelCommand:
    return ModelCommand(action="rollback", fleet=fleet, device_id=device_id,
                        command_id=uuid.uuid4().hex, version=version)


def publish_commands(address, fleet: str, messages: dict[str, bytes], *, wait: float = 0.0,
                     expect: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Publish each device its model message (retained); with ``wait``, collect the devices'
    reports until each names its expected version ("*": any fresh report) or an error, or time runs
    out."""
    from edgefl.transport.mqtt import Topics

    topics = Topics(fleet)
    reports: dict[str, dict[str, Any]] = {}
    fresh: dict[str, dict[str, Any]] = {}
    started = time.time()
    done = threading.Event()

    def on_message(topic: str, data: bytes) -> None:
        where = topics.parse_device(topic)
        if where is None or not data:
            return
        try:
            report = parse_active(data)  # a device's report: bounded, closed schema
        except WireError as e:
            log.warning("ignoring a malformed model report from %s: %s", where[0], e)
            return
        reports[where[0]] = report
        if float(report.get("time", 0)) >= started:
            fresh[where[0]] = report
        if expect is not None and all(
            d in fresh and (v in ("*", fresh[d].get("version")) or fresh[d].get("error"))
            for d, v in expect.items()
        ):
            done.set()

    # the agent's status (``agent``); an earlier version's agent said it on ``status``
    status: dict[str, dict[str, str]] = {"agent": {}, "status": {}}

    def on_status(topic: str, data: bytes) -> None:
        where = topics.parse_device(topic)
        if where is not None and where[1] in status:
            try:
                status[where[1]][where[0]] = parse_status(data)[0]
            except WireError as e:
                log.warning("ignoring %s's %s: %s", where[0], where[1], e)

    def on_any(topic: str, data: bytes) -> None:
        (on_status if topic.endswith(("/status", "/agent")) else on_message)(topic, data)

    leaves = ("active", "agent", "status") if wait > 0 else ()
    subscribe = tuple(topics.device("+", leaf) for leaf in leaves)
    conn = _connect(
        address, f"edgefl-{fleet}-deploy-{uuid.uuid4().hex[:6]}", fleet, on_any, subscribe
    ).start()
    try:
        for device_id, data in messages.items():
            info = conn.client.publish(topics.device(device_id, "model"), data, qos=1, retain=True)
            info.wait_for_publish(30)
        if wait > 0:
            done.wait(wait)
    finally:
        conn.stop()
    if wait <= 0:
        return {}

    def missing(d: str) -> dict[str, Any]:
        state = status["agent"].get(d, status["status"].get(d))
        if state == "offline":
            why = (
                "the device is offline; the model stays on the broker (retained) and installs "
                "when its agent connects"
            )
        elif state is None and d not in reports:
            why = (
                "the device has never connected a model agent (edgefl device agent, or edgefl "
                "train --models-dir)"
            )
        else:
            why = f"no report from the device within {wait:g} s"
        return {"error": why, "status": state, "last_report": reports.get(d)}

    return {d: fresh.get(d) or missing(d) for d in messages}


def rollout_messages(fleet: str, targets, *, version: str, say: Callable[[str], None] = print
                     ) -> tuple[dict[str, bytes], dict[str, str]]:
    """Each target device's command (``edgefl.export.deployment.Target``: a file, or none for a
    rollback) and the version its report must name ("*": any fresh report; a rollback's device
    knows its previous version)."""
    messages: dict[str, bytes] = {}
    expect: dict[str, str] = {}
    for t in targets:
        if t.path is None:
            messages[t.device] = encode_command(rollback_command(fleet, t.device))
            expect[t.device] = "*"
            continue
        data = Path(t.path).read_bytes()
        command = deploy_command(fleet, t.device, data, version=version, tier=t.tier, fmt=t.fmt)
        messages[t.device], expect[t.device] = encode_command(command, data), version
        say(f"{t.device}: {t.path} ({t.fmt}, {len(data)} bytes) as version {version}")
    return messages, expect


def check_reports(reports: dict[str, dict[str, Any]], expect: dict[str, str]) -> None:
    """Raise unless every device reported its expected version: exit 3 if one refused the model
    (it answered and said no), 1 if none refused but some did not answer (try again later)."""
    failed = [
        d for d, r in reports.items() if r.get("error") or expect[d] not in ("*", r.get("version"))
    ]
    if not failed:
        return
    refused = [d for d in failed if "version" in reports[d]]
    error = ConfigError if refused else EdgeflError
    raise error(
        f"{len(failed)} of {len(reports)} devices did not take the model: "
        f"{', '.join(sorted(failed))}"
    )
