"""Which installed package a failure came from, said plainly for the page.

A server whose packages are not the tested set (deploy/locks/requirements.txt) fails deep inside
a library: transformers 5.25.0 importing a wrong ``kernels`` raised "ImportError: cannot import
name 'CUDAProperties' from 'kernels' (/…/kernels/__init__.py)" while the model loaded, and the page
said only "Something went wrong on the server (ImportError)". ``describe_failure`` names the
distribution and version the traceback's innermost installed frame belongs to (or the package
that is missing), the tested version where the lock knows it, and the command that installs the
tested set. The text never holds a server path; the traceback stays in the server's log.
"""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import re
import site
import sysconfig
import traceback
from pathlib import Path

from app import hosting
from app.tested_set import PAGE_LOCK, normalize, pinned

LOCK = PAGE_LOCK
FIX = "run `bash deploy/install.sh` to install it (add --dev for the tests)"
# besides the ImportError family, a failure raised inside one of these is the packages' problem
MODEL_PACKAGES = {"transformers", "tokenizers", "safetensors", "huggingface-hub", "torch"}
MAX_DETAIL = 140

_PAREN_PATH = re.compile(r"\s*\([^()]*[/\\][^()]*\)")
_PATH = re.compile(r"(?<![\w:/.~…-])~?/[^\s'\"`,;()\[\]{}<>]+")


def tested_versions(lock: Path | None = None) -> dict[str, str]:
    """normalized name -> version pinned in the page's lock; {} without one."""
    return pinned(lock or LOCK)


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = [paths.get("purelib"), paths.get("platlib")]
    try:
        dirs += site.getsitepackages()
    except AttributeError:             # some virtualenvs' site module lacks it
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    return sorted({os.path.realpath(d) for d in dirs if d}, key=len, reverse=True)


def _top_module(filename: str, dirs: list[str]) -> str | None:
    """The top-level module an installed file belongs to ("transformers"), None if the file
    is not under a site-packages/dist-packages directory."""
    real = os.path.realpath(filename)
    for d in dirs:
        if real.startswith(d + os.sep):
            rest = real[len(d) + 1:]
            break
    else:
        parts = Path(real).parts
        idx = [i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")]
        if not idx or idx[-1] + 1 >= len(parts):
            return None
        rest = os.path.join(*parts[idx[-1] + 1:])
    first = rest.split(os.sep, 1)[0]
    return first.split(".", 1)[0] if os.sep not in rest else first


def distribution(module: str) -> tuple[str, str] | None:
    """(distribution name, installed version) providing top-level ``module``."""
    try:
        names = metadata.packages_distributions().get(module, [])
    except Exception:                  # broken metadata of some other package
        names = []
    names = sorted(set(names), key=lambda n: normalize(n) != normalize(module))
    for name in names or [module]:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _tested(name: str, version: str | None, tested: dict[str, str]) -> str:
    want = tested.get(normalize(name))
    return f" (tested: {want})" if want and want != version else ""


def _detail(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    text = hosting.public_message(_PAREN_PATH.sub("", text))
    text = _PATH.sub(lambda m: "…/" + m.group(0).rstrip("/.:").rsplit("/", 1)[-1], text)
    if len(text) > MAX_DETAIL:
        text = text[:MAX_DETAIL - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _loading(frames) -> bool:
    return any(Path(f.filename).parts[-3:] == ("engine", "models", "loader.py") for f in frames)


def describe_failure(exc: BaseException) -> str | None:
    """One short line naming the installed package (and version) a failure came from and the
    command that installs the tested set; None when it is not a package problem."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    importing = isinstance(exc, ImportError)
    dirs = _site_dirs()
    where = next(((f, m) for f in reversed(frames)
                  if (m := _top_module(f.filename, dirs)) is not None), None)
    tested = tested_versions()
    what = "Loading the model failed" if _loading(frames) else "The server failed"
    missing = None
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".", 1)[0]
        if not _installed(top):
            missing = top
    if missing:
        inside = ""
        if where is not None and (dist := distribution(where[1])) is not None:
            inside = f" (needed by {dist[0]} {dist[1]})"
        head = (f"{what}: the package {missing} is not installed{inside}"
                f"{_tested(missing, None, tested)}.")
    else:
        if where is None and importing and exc.name:   # raised in our code: the module named
            where = (None, exc.name.split(".", 1)[0])
        if where is None:
            return None
        dist = distribution(where[1])
        if dist is None:
            return None
        name, version = dist
        if not importing:
            # elsewhere only a failure raised inside the model's libraries, in their own code
            if frames[-1] is not where[0] or normalize(name) not in MODEL_PACKAGES:
                return None
            if tested.get(normalize(name)) == version:   # the tested version: not the set
                return (f"{what} inside {name} {version} ({_detail(exc)}); it was logged on "
                        "the server. Try again, or change the settings.")
        head = f"{what} inside {name} {version}{_tested(name, version, tested)} ({_detail(exc)})."
        other = exc.name.split(".", 1)[0] if importing and exc.name else None
        if other and normalize(other) != normalize(where[1]):
            found = distribution(other)
            path = getattr(exc, "path", None)
            stray = bool(path) and _top_module(path, dirs) is None
            if found is not None and stray:
                # the installed set is fine; a folder earlier on sys.path hides a package
                return (f"{head} The {other} it imported is a stray copy, not the installed "
                        f"{other} {found[1]}: move that folder off the Python path (the server "
                        "log names it) and restart the page.")
            elif found is not None:
                head += f" {found[0]} {found[1]} is installed{_tested(*found, tested)}."
            elif normalize(other) in tested:
                head += (f" The {other} it found is not the tested {other} "
                         f"{tested[normalize(other)]}.")
    return f"{head} The installed packages are not the tested set: {FIX}."


__all__ = ["describe_failure", "tested_versions", "normalize", "distribution"]
