"""The user's settings file: a default model, aliases (a short name for a spec) and stored
API keys, in `$XDG_CONFIG_HOME/recursa/config.toml` (default `~/.config/recursa/config.toml`):

    default_model = "ollama:llama3.2"

    [aliases]
    fast = "openai:gpt-5-mini"

    [keys]
    openai = "sk-..."

The file is written whole, as a new 0600 file moved over the old one (so it is never readable
by others, whatever the old file's mode); keys are read only from a file no one else can read,
and appear in no repr. The environment wins over the file: RECURSA_MODEL over the default,
each provider's key variables (OPENAI_API_KEY, ...) over a stored key. recursa.models resolves
specs through it (`resolve_model`, `stored_key`); `recursa models default`, `recursa aliases`
and `recursa keys` edit it.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from recursa.base.privatefiles import open_private, private_dir
from recursa.base.types import RecursaError

ALIAS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class ConfigError(RecursaError, ValueError):
    """The settings file cannot be used as it is (its message names the file and the fix)."""


@dataclass
class UserConfig:
    """The file's contents. `keys` (provider prefix -> key, read only when asked for) is never
    shown by repr; `key_names` are the providers with a stored key (always read)."""

    default_model: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict, repr=False)
    key_names: tuple[str, ...] = ()


def config_path() -> Path:
    """Where the file is: $XDG_CONFIG_HOME/recursa/config.toml, else ~/.config/recursa/..."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):       # the XDG spec: a relative value is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "recursa" / "config.toml"


def load(path: Path | None = None, *, keys: bool = False) -> UserConfig:
    """The file's settings (empty when there is no file). `keys=True` reads the stored keys
    too, and refuses (ConfigError) a file that others can read or write."""
    return _read(config_path() if path is None else path, keys=keys)[0]


def load_for_update(path: Path | None = None) -> tuple[UserConfig, int]:
    """Everything in the file, keys included whatever its mode, to change and `save` (which
    writes it 0600): keys in a file others can read are kept, never used. With it, the old
    file's mode when others could read or change it (else 0), for the caller to say so."""
    cfg, mode = _read(config_path() if path is None else path, keys=True, strict=False)
    return cfg, mode if mode & 0o077 else 0


def _read(path: Path, *, keys: bool, strict: bool = True) -> tuple[UserConfig, int]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return UserConfig(), 0
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the recursa settings ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)   # of the file read, not a swap
        raw = f.read()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: not a valid TOML file ({e}); fix or remove it") from None
    cfg = UserConfig(default_model=_text(data, "default_model", path),
                     aliases=_table(data, "aliases", path))
    stored = _table(data, "keys", path)
    cfg.key_names = tuple(sorted(k for k, v in stored.items() if v))
    if keys and stored:
        if strict and mode & 0o077:
            raise ConfigError(
                f"{path} holds API keys but others can read or change it (mode "
                f"{mode:04o}), so recursa does not use them: run `chmod 600 {path}`, and "
                "replace the keys if others may have read them")
        cfg.keys = stored
    return cfg, mode


def save(cfg: UserConfig, path: Path | None = None) -> Path:
    """Write `cfg` as the whole file, created 0600 (its directory 0700 when recursa makes
    it), by a rename: a reader sees the old file or the new one, never half of one."""
    path = config_path() if path is None else path
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)             # a leftover of a writer that died: recreate 0600
    try:
        with open_private(tmp, "w") as f:
            f.write(dumps(cfg))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def dumps(cfg: UserConfig) -> str:
    """The TOML text of `cfg` (strings only, so a writer this small will do)."""
    lines = []
    if cfg.default_model:
        lines.append(f"default_model = {_quote(cfg.default_model)}")
    for table, items in (("aliases", cfg.aliases), ("keys", cfg.keys)):
        if items:
            lines += ["", f"[{table}]"] + [f"{_key(k)} = {_quote(v)}"
                                           for k, v in sorted(items.items())]
    return "\n".join(lines).lstrip("\n") + "\n"


def _key(name: str) -> str:
    """A TOML key: bare when it may be, else quoted."""
    return name if _BARE_KEY.fullmatch(name) else _quote(name)


def _quote(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _text(data: dict[str, object], key: str, path: Path) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: {key} must be a model spec in quotes, e.g. "
                          f'{key} = "ollama:llama3.2"')
    return value.strip()


def _table(data: dict[str, object], key: str, path: Path) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{path}: [{key}] must be a table of NAME = \"TEXT\" lines")
    return {str(k): str(v) for k, v in value.items()}


def stored_key(prefix: str) -> str | None:
    """The key stored for provider `prefix`, or None (read only when asked for: a run whose
    keys come from the environment never opens the file)."""
    return load(keys=True).keys.get(prefix) or None
