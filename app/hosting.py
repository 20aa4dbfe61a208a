"""Operator settings for hosting one lab server for a whole class, and the checks they drive.

A teacher runs ``streamlit run app`` and gives the address to a class. Every session is then
somebody else's input, so the server is safe and bounded by default; the operator widens the
limits with environment variables (read on every check, so a test can monkeypatch them):

``PAGED_LAB_MODELS``               comma-separated folders or hub ids a session may choose.
                                   ``default`` (the embedded model) and ``PAGED_LAB_MODEL`` (the
                                   model a session starts with) are always allowed. ``*`` allows
                                   any folder or hub id: only for one user on their own machine.
                                   Default: empty (only those two).
``PAGED_LAB_MAX_MODELS``           models kept loaded in memory, least recently used dropped
                                   first (read by ``engine.models.loader``). Default 2.
``PAGED_LAB_MAX_CHECKPOINT_MB``    largest checkpoint a session may load, in MiB of weights as
                                   the safetensors headers give them. Default 1024.
``PAGED_LAB_MAX_KV_MB``            largest KV cache (GPU + CPU pools) one engine may allocate,
                                   in MiB. Default 64. The Compare tab runs a v0 and a v1 engine
                                   with the same settings, so a session holds at most 3 such pools.
``PAGED_LAB_MAX_TRACE_SNAPSHOTS``  longest trace (snapshots) an upload may hold. Default 2000.
``PAGED_LAB_MAX_TRACE_MB``         largest trace JSON a gzip upload may inflate to, in MiB
                                   (a 400-step trace is about 34). Default 64.
``PAGED_LAB_IDLE_MINUTES``         a session idle this long loses its engine, history and
                                   replayed trace (it gets a fresh engine when it comes back).
                                   0 = never. Default 30.
``PAGED_LAB_DISCONNECTED_SECONDS`` a session whose browser went away (tab closed, connection
                                   lost) keeps its engine and history this long, then they are
                                   released like an idle session's. 0 = until idle. Default 30
                                   (or Streamlit's reconnect window,
                                   ``server.disconnectedSessionTTL``, if shorter): a dropped
                                   connection that comes back within it continues where it was,
                                   and a class that leaves gives its memory back within a minute
                                   (the sweeper looks every 5 s; docs/hosting.md, "A class of
                                   100").
``PAGED_LAB_TORCH_THREADS``        threads torch may use for one engine step. Default 1: the
                                   sessions' steps already run side by side, and on 2 cores a
                                   second thread per tiny step cost more CPU than it saved
                                   (0.10 -> 0.04 s of server CPU per Step click, measured).
                                   Raise it for one user with a large model on the CPU.
``PAGED_LAB_REAL_VLLM``            how many sessions may run the real vLLM at once (the Engine
                                   choice "Real vLLM": vLLM in this process, with its own copy
                                   of the weights and a KV pool bounded like our engine's, and
                                   about 2 s to start, 7 s the first time). Default 0: off, the
                                   choice says how to turn it on. One user on their own machine:
                                   ``PAGED_LAB_REAL_VLLM=1``.
``PAGED_LAB_WATCH_ENDPOINTS``      comma-separated ZeroMQ endpoints the Watch vLLM tab may
                                   watch; ``tcp://HOST:FIRST-LAST`` is a range of ports. Every
                                   socket the tab would open must be on it: the endpoint and the
                                   replay endpoint, for each data-parallel rank (port + rank).
                                   ``*`` allows any endpoint: only for one user on their own
                                   machine. Default: a local ``vllm serve``'s KV event ports,
                                   ``tcp://127.0.0.1:5557-5564``, ``tcp://127.0.0.1:6557-6564``
                                   and the same on ``localhost`` (live 5557 + rank, replay 5558
                                   with one rank or 6557 + rank; 8 ranks), and the scheduler
                                   tap's ``tcp://127.0.0.1:5570-5577`` (and ``localhost``).
``PAGED_LAB_WATCH_LISTEN``         1: the Watch tab's Listen (bind the endpoint on this server,
                                   for a publisher that connects) is allowed, for endpoints on
                                   the list above. Default 0: off.
``PAGED_LAB_WATCH_IPC``            1: ``ipc://`` endpoints (socket files on this server; Listen
                                   creates one) are allowed, for endpoints on the list above.
                                   Default 0: off.
``PAGED_LAB_TAKE_TURNS``           1: in one server process one session at a time steps its
                                   engine and draws its view, in arrival order (app/turns.py):
                                   a class's clicks then cost the same CPU as one student's.
                                   0: every session's run goes at once, as Streamlit does.
                                   Default 1.
``server.maxUploadSize``           (``.streamlit/config.toml``) largest upload, in MB. Default 5.

Every check here runs before anything is loaded: a refused model is never resolved, read or
downloaded, a refused KV cache is never allocated, and for a refused watch no socket is made
(nothing connects, binds or creates a file).
"""
from __future__ import annotations

import functools
import math
import os
import re

from engine.models.memory_plan import checkpoint_facts, memory_plan
from engine.kv_events.wire import check_endpoint, offset_endpoint_port, shown

DEFAULT_MODEL = "default"
ANY_MODEL = "*"
DEFAULT_MAX_CHECKPOINT_MB = 1024
DEFAULT_MAX_KV_MB = 64
DEFAULT_MAX_TRACE_SNAPSHOTS = 2000
DEFAULT_IDLE_MINUTES = 30
DEFAULT_DISCONNECTED_SECONDS = 30.0      # at most; Streamlit's reconnect window is 120 s
MiB = 1024 * 1024
# a local `vllm serve`'s KV event sockets: live on 5557 + rank, replay on 5558 (one rank, as in
# the README) or 6557 + rank (the docs' base for several ranks), for up to 8 ranks
# and the scheduler tap's (real_vllm/tap/frames.py DEFAULT_ENDPOINT) on 5570 + rank
DEFAULT_WATCH_ENDPOINTS = ("tcp://127.0.0.1:5557-5564", "tcp://localhost:5557-5564",
                           "tcp://127.0.0.1:6557-6564", "tcp://localhost:6557-6564",
                           "tcp://127.0.0.1:5570-5577", "tcp://localhost:5570-5577")
ANY_ENDPOINT = "*"


# ---- reading the settings ------------------------------------------------------------------
def _number(name: str, default: float, *, integer: bool = False, allow_zero: bool = False):
    """An env var as a positive number (or the default when unset); a bad value names itself."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"the server setting {name} must be {kind} "
                         f"{'>= 0' if allow_zero else '> 0'}, got {raw!r}")
    return value


def initial_model() -> str:
    """The model a new session starts with (``PAGED_LAB_MODEL``, else the embedded one)."""
    return os.environ.get("PAGED_LAB_MODEL", "").strip() or DEFAULT_MODEL


def allowed_models() -> list[str] | None:
    """The models a session may choose, in the Model field's order; None = any (``*``)."""
    listed = [m.strip() for m in os.environ.get("PAGED_LAB_MODELS", "").split(",")]
    if ANY_MODEL in listed:
        return None
    return list(dict.fromkeys([DEFAULT_MODEL, initial_model(), *(m for m in listed if m)]))


def max_checkpoint_bytes() -> int:
    return int(_number("PAGED_LAB_MAX_CHECKPOINT_MB", DEFAULT_MAX_CHECKPOINT_MB) * MiB)


def max_kv_bytes() -> int:
    return int(_number("PAGED_LAB_MAX_KV_MB", DEFAULT_MAX_KV_MB) * MiB)


def max_trace_snapshots() -> int:
    return _number("PAGED_LAB_MAX_TRACE_SNAPSHOTS", DEFAULT_MAX_TRACE_SNAPSHOTS, integer=True)


def max_trace_json_bytes() -> int:
    return int(_number("PAGED_LAB_MAX_TRACE_MB", 64) * MiB)


def idle_seconds() -> float | None:
    """Idle time after which a session is released; None = never (``PAGED_LAB_IDLE_MINUTES=0``)."""
    minutes = _number("PAGED_LAB_IDLE_MINUTES", DEFAULT_IDLE_MINUTES, allow_zero=True)
    return minutes * 60 if minutes else None


def disconnected_seconds() -> float | None:
    """How long a session whose browser went away keeps its engine and history; None = until
    it is idle (``PAGED_LAB_DISCONNECTED_SECONDS=0``). Default 30 s, or Streamlit's own
    reconnect window (``server.disconnectedSessionTTL``, 120 s) if that is shorter: a session
    Streamlit has dropped cannot come back, and 30 s covers a dropped connection's reconnect
    while a class's memory comes back within a minute of it leaving."""
    default = DEFAULT_DISCONNECTED_SECONDS
    try:
        import streamlit as st
        default = min(default, float(st.get_option("server.disconnectedSessionTTL")))
    except Exception:                    # no Streamlit config here (engine-only use)
        pass
    seconds = _number("PAGED_LAB_DISCONNECTED_SECONDS", default, allow_zero=True)
    return seconds or None


def _flag(name: str, default: bool = False) -> bool:
    """An on/off env var: 1 on, 0 off, unset ``default``; anything else names itself."""
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"the server setting {name} must be 0 or 1, got {raw!r}")
    return raw == "1" if raw else default


def watch_endpoints() -> list[str] | None:
    """The endpoints the Watch tab may watch (``tcp://HOST:FIRST-LAST`` a port range);
    None = any (``*``). Unset or empty: a local vLLM's ports (DEFAULT_WATCH_ENDPOINTS)."""
    listed = [e.strip() for e in os.environ.get("PAGED_LAB_WATCH_ENDPOINTS", "").split(",")]
    listed = [e for e in listed if e] or list(DEFAULT_WATCH_ENDPOINTS)
    return None if ANY_ENDPOINT in listed else listed


def watch_listen_allowed() -> bool:
    return _flag("PAGED_LAB_WATCH_LISTEN")


def watch_ipc_allowed() -> bool:
    return _flag("PAGED_LAB_WATCH_IPC")


def real_vllm_sessions() -> int:
    """Sessions that may run the real vLLM at once; 0 = the choice is off (the default)."""
    return _number("PAGED_LAB_REAL_VLLM", 0, integer=True, allow_zero=True)


def take_turns() -> bool:
    return _flag("PAGED_LAB_TAKE_TURNS", default=True)


def torch_threads() -> int:
    return _number("PAGED_LAB_TORCH_THREADS", 1, integer=True)


@functools.cache
def apply_torch_threads() -> None:
    """Once per server process (torch's thread count is process-wide)."""
    import torch
    torch.set_num_threads(torch_threads())


# ---- the checks ----------------------------------------------------------------------------
class ModelNotOffered(ValueError):
    """A session asked for a model outside the operator's list (it holds only what the
    session typed and the list, so the page shows it as it is)."""


def check_model_allowed(model) -> str:
    """``model`` (stripped) if this server offers it; else ValueError naming PAGED_LAB_MODELS.
    Only compares strings: nothing is resolved, read or downloaded."""
    if not isinstance(model, str):
        raise ValueError(f"model must be a string, got {type(model).__name__}")
    name = model.strip() or DEFAULT_MODEL
    allowed = allowed_models()
    if allowed is None or name in allowed:
        return name
    shown = name if len(name) <= 80 else name[:77] + "..."
    raise ModelNotOffered(f"model {shown!r} is not offered on this server: choose one of "
                          f"{', '.join(allowed)}. The server's operator lists the models "
                          "sessions may use in PAGED_LAB_MODELS.")


def _mib(n: float) -> str:
    v = n / MiB
    return f"{v:,.0f}" if v >= 10 else f"{v:.2g}"


def check_resources(config) -> None:
    """Refuse (ValueError naming the setting) a checkpoint or a KV cache over this server's
    limits. Call only for an allowed model: it resolves the model's folder and reads its
    config.json and safetensors headers, never its weights, and allocates nothing."""
    weights = checkpoint_facts(config.model)[2]         # before the device is resolved
    limit = max_checkpoint_bytes()
    if weights > limit:
        raise ValueError(f"model {config.model!r} has {_mib(weights)} MiB of weights: this "
                         f"server loads checkpoints up to {_mib(limit)} MiB "
                         "(PAGED_LAB_MAX_CHECKPOINT_MB)")
    plan = memory_plan(config)
    need, blocks = plan.kv_cache_bytes, plan.num_blocks
    limit = max_kv_bytes()
    if need > limit:
        per_slot = plan.bytes_per_token_slot
        raise ValueError(f"this KV cache would take {need / MiB:,.1f} MiB (block size "
                         f"{config.block_size} x {blocks} blocks x {per_slot:,} bytes per token "
                         f"slot): a session may allocate at most {_mib(limit)} MiB "
                         "(PAGED_LAB_MAX_KV_MB). Lower the block size or the pool sizes.")


class WatchNotAllowed(ValueError):
    """A session asked to watch an endpoint, or to watch in a way (Listen, ipc://), that this
    server does not allow (the message names what was typed and the setting that allows it)."""


# the words of check_watch_allowed's messages: the Python API's names (the Watch tab passes its
# field labels instead)
WATCH_API_NAMES = {"endpoint": "endpoint", "replay_endpoint": "replay_endpoint",
                   "bind": "bind=True", "data_parallel_size": "data_parallel_size"}
_PORT_RANGE = re.compile(r"(?P<base>tcp://.+):(?P<first>[0-9]+)-(?P<last>[0-9]+)")


def check_watch_allowed(endpoint, replay_endpoint=None, *, bind: bool = False,
                        data_parallel_size: int = 1,
                        names: dict[str, str] = WATCH_API_NAMES) -> tuple[str, str | None]:
    """(endpoint, replay endpoint or None), stripped, as ``KVEventSubscriber`` takes them, if
    this server lets a session watch them; else ValueError in ``names``' words, naming the
    endpoint as typed and the setting that would allow it. Every socket the subscriber would
    open is checked (each rank's port, the replay socket's too). Compares strings and reads
    settings only: no socket is made, nothing connects, binds, resolves or creates a file."""
    endpoint = check_endpoint(endpoint, names["endpoint"], bind=bind)
    if replay_endpoint is not None and not str(replay_endpoint).strip():
        replay_endpoint = None
    if replay_endpoint is not None:
        replay_endpoint = check_endpoint(replay_endpoint, names["replay_endpoint"])
    ranks = data_parallel_size
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= 64:
        raise ValueError(f"{names['data_parallel_size']} must be a whole number from 1 to 64, "
                         f"got {ranks!r}")
    _check_watch_socket(endpoint, "endpoint", bind, ranks, names)
    if replay_endpoint is not None:
        _check_watch_socket(replay_endpoint, "replay_endpoint", False, ranks, names)
    return endpoint, replay_endpoint


def _check_watch_socket(endpoint: str, field: str, bind: bool, ranks: int,
                        names: dict[str, str]) -> None:
    """One field's endpoint (``field`` a key of ``names``), for every rank, or WatchNotAllowed."""
    what = f"the {names[field]} {shown(endpoint)!r}"
    reasons, settings = [], []
    if endpoint.startswith("ipc://") and not watch_ipc_allowed():
        reasons.append("ipc:// endpoints (socket files on this server) are off")
        settings.append("PAGED_LAB_WATCH_IPC=1")
    if bind and not watch_listen_allowed():
        reasons.append(f"{names['bind']} (binding it on this server) is off")
        settings.append("PAGED_LAB_WATCH_LISTEN=1")
    sockets = _per_rank(endpoint, ranks)
    listed = watch_endpoints()
    missing = None if listed is None else next(
        (ep for ep in sockets or [endpoint] if not _listed(ep, listed)), None)
    if missing == endpoint:
        reasons.append(f"it is not on the server's list of endpoints to watch "
                       f"({_listing(listed)})")
    elif missing is not None:            # a rank's port (vLLM's port + rank) is off the list
        reasons.append(f"with {names['data_parallel_size']} {ranks} it also watches "
                       f"{shown(missing)}, which is not on the server's list of endpoints to "
                       f"watch ({_listing(listed)})")
    if missing is not None:
        settings.append(f"{shown(missing)} in PAGED_LAB_WATCH_ENDPOINTS")
    if reasons:
        raise WatchNotAllowed(f"this server does not let sessions watch {what}: "
                              f"{'; '.join(reasons)}. Its operator allows it with "
                              f"{' and '.join(settings)}.")
    if sockets is None:
        raise ValueError(f"{what} has no per-rank form (only tcp:// and inproc:// have one): "
                         f"set {names['data_parallel_size']} to 1")


def _per_rank(endpoint: str, ranks: int) -> list[str] | None:
    """The endpoint of each data-parallel rank (vLLM's port + rank); None: it has no per-rank
    form (ipc://) and ``ranks`` > 1."""
    try:
        return [offset_endpoint_port(endpoint, r) for r in range(ranks)]
    except ValueError:
        return None


def _listed(endpoint: str, listed: list[str]) -> bool:
    """On the list as written, or in one of its port ranges (exact strings: no name is
    resolved, so a listed host name is the only way to that host)."""
    if endpoint in listed:
        return True
    base, _, port = endpoint.rpartition(":")
    return port.isdigit() and any(
        m is not None and m["base"] == base and int(m["first"]) <= int(port) <= int(m["last"])
        for m in map(_PORT_RANGE.fullmatch, listed))


def _listing(listed: list[str], most: int = 6) -> str:
    more = f" and {len(listed) - most} more" if len(listed) > most else ""
    return ", ".join(shown(e) for e in listed[:most]) + more


# ---- what the page may show ----------------------------------------------------------------
_SERVER_PATH = re.compile(r"(?<![\w:/.~-])~?/[^\s'\"`,;()\[\]{}<>]+")


def public_message(text: str) -> str:
    """``text`` without the server's file paths (each becomes its last part), except the
    models the operator offers, which the Model field shows anyway. With ``*`` (one user on
    their own machine) the text is shown as it is."""
    allowed = allowed_models()
    if allowed is None:
        return text
    allowed = set(allowed)

    def short(m: re.Match) -> str:
        path = m.group(0).rstrip(".:")               # a sentence's full stop is not the path's
        rest = m.group(0)[len(path):]
        if path in allowed or path.rstrip("/") in allowed:
            return path + rest
        return "…/" + path.rstrip("/").rsplit("/", 1)[-1] + rest
    return _SERVER_PATH.sub(short, text)
