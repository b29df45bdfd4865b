"""Reading YAML that people wrote: bounded, UTF-8, and only the plain subset of YAML a config needs.

Every config-like file (run configs, snapshots, sweep files, chaos schedules) and every ``key=value``
override goes through here before OmegaConf sees it, so that nothing in the text can cost more than
its size or end in a traceback:

- the file is opened without blocking (a FIFO cannot hang us), must be a regular file and is never read
  past :data:`MAX_BYTES`;
- the bytes must be UTF-8 (a UTF-8 BOM is fine) without control characters;
- anchors and aliases are refused: they are how a few hundred bytes expand into billions of nodes
  ("billion laughs"), and a config never needs them;
- duplicate keys are refused (YAML would silently keep the last one);
- explicit tags other than the plain ``!!str``/``!!int``/... are refused, so ``!!python/object`` is never
  constructed; dates and base-60 numbers stay strings (``time: 1:30:00`` is not the integer 5400);
- nesting deeper than :data:`MAX_DEPTH` is refused before it can exhaust the stack.

Each refusal is a :class:`Problem` whose key is ``file:line:column`` (1-based).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any, Optional, Tuple

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from hpc_agent.config.problems import ConfigError, Problem

MAX_BYTES = 1 << 20   # 1 MiB: a config is a few KiB; anything near this is a mistake or an attack
MAX_DEPTH = 32        # mappings/lists nested deeper than this are not a config
MAX_INT = 1 << 63     # integers beyond 64 bits mean nothing to Slurm or the trainer

_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")} | {"!"}
# YAML forbids C0 controls other than tab/LF/CR, DEL, C1 controls, surrogates and U+FFFE/U+FFFF.
_BAD_CHAR = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _drop(resolvers: dict, tags: set) -> dict:
    return {first: [(tag, rx) for tag, rx in entries if tag not in tags] for first, entries in resolvers.items()}


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader minus anchors/aliases, duplicate keys, odd tags, YAML 1.1 base-60 numbers and dates."""

    # Dates, base-60 numbers, '<<' merge keys and '=' become plain strings (or unknown keys).
    yaml_implicit_resolvers = _drop(yaml.SafeLoader.yaml_implicit_resolvers, {
        "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp",
        "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise ComposerError(None, None, f"found an alias (*{event.anchor}); config files may not use YAML "
                                "anchors or aliases (they can expand without bound): write the value out",
                                event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise ComposerError(None, None, f"found an anchor (&{event.anchor}); config files may not use YAML "
                                "anchors or aliases (they can expand without bound): write the value out",
                                event.start_mark)
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _PLAIN_TAGS:
            raise ComposerError(None, None, f"found the tag {tag!r}; only plain values are allowed (no "
                                "!!python/..., !!binary, !!set or custom tags): remove the tag", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"found mappings/lists nested more than {MAX_DEPTH} deep",
                                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
            # ``!!int ''``, ``!!bool maybe``, ``!!float x``: PyYAML's constructors fail without a mark.
            raise ConstructorError(None, None, f"found {getattr(node, 'value', '')!r:.80}, which is not a valid "
                                   f"{node.tag.rsplit(':', 1)[-1]} ({exc.__class__.__name__})", node.start_mark) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # a list or mapping as a key
                raise ConstructorError(None, None, "found a list or mapping used as a key", key_node.start_mark)
            if duplicate:
                raise ConstructorError(None, None, f"found the key {key!r} twice in one mapping; keep one",
                                       key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # '0x_' and the like match the resolver but are no number
            raise ConstructorError(None, None, f"found {node.value!r}, which is not a number", node.start_mark)
        if abs(value) >= MAX_INT:
            raise ConstructorError(None, None, "found an integer that does not fit in 64 bits", node.start_mark)
        return value

    def construct_yaml_float(self, node: Any) -> Any:
        try:
            return super().construct_yaml_float(node)
        except ValueError:
            raise ConstructorError(None, None, f"found {node.value!r}, which is not a number", node.start_mark)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _ConfigLoader.construct_yaml_float)
# Decimal, 0x and 0o/0b integers up to 20 digits (longer is refused above or stays a string).
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(
    r"^(?:[-+]?(?:0|[1-9][0-9_]{0,24})|[-+]?0x[0-9a-fA-F_]{1,20}|[-+]?0b[01_]{1,70}|[-+]?0[0-7_]{1,25})$"),
    list("-+0123456789"))
# YAML 1.2 floats as OmegaConf reads them (1e-3 is a float), without base-60.
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789."))


def _where(source: str, line: int, column: int) -> str:
    return f"{source}:{line + 1}:{column + 1}"


def _line_col(text: str, index: int) -> Tuple[int, int]:
    line = text.count("\n", 0, index)
    return line, index - (text.rfind("\n", 0, index) + 1)


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a UTF-8 BOM is dropped), or a ConfigError at the first bad byte or character."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ConfigError([Problem(_where(source, 0, 0), "a UTF-16/32 byte order mark", "a file saved as UTF-8")])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        head = data[:exc.start]
        line, col = head.count(b"\n"), len(head) - (head.rfind(b"\n") + 1)
        raise ConfigError([Problem(_where(source, line, col), f"the byte 0x{data[exc.start]:02x}",
                                   "a file saved as UTF-8 (this byte is not UTF-8)")]) from None
    bad = _BAD_CHAR.search(text)
    if bad:
        line, col = _line_col(text, bad.start())
        raise ConfigError([Problem(_where(source, line, col), f"the character U+{ord(bad.group()):04X}",
                                   "printable text: remove the control character (NUL, escape, ...)")])
    return text


def parse_text(text: str, source: str) -> Any:
    """The YAML document in ``text`` as plain Python values (dict, list, str, int, float, bool, None)."""
    if len(text) > MAX_BYTES:
        raise ConfigError([Problem(source, f"{len(text)} characters", f"at most {MAX_BYTES} bytes (1 MiB)")])
    bad = _BAD_CHAR.search(text)
    if bad:
        line, col = _line_col(text, bad.start())
        raise ConfigError([Problem(_where(source, line, col), f"the character U+{ord(bad.group()):04X}",
                                   "printable text: remove the control character (NUL, escape, ...)")])
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _where(source, mark.line, mark.column) if mark is not None else source
        what = exc.problem or exc.context or "invalid YAML"
        hint = " (YAML indents with spaces, never tabs)" if "\\t" in what or "tab" in what else ""
        raise ConfigError([Problem(where, _snippet(text, mark), f"valid YAML: {what}{hint}")]) from None
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        raise ConfigError([Problem(source, "<file>", f"valid YAML ({exc.__class__.__name__}: {exc})")]) from None
    finally:
        loader.dispose()


def _snippet(text: str, mark: Optional[Any]) -> str:
    if mark is None:
        return "<file>"
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    return line.strip()[:80] or "<end of file>"


def _describe(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def read_bytes(path: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, never reading past ``max_bytes``. Links are followed (a config may be one);
    the open never blocks (a FIFO is refused, not waited on)."""
    source = str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        reason = "a symbolic link loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc)).lower()
        raise ConfigError([Problem(source, "<file>", f"a readable YAML file (cannot open it: {reason})")]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([Problem(source, _describe(info.st_mode), "a regular YAML file")])
        if info.st_size > max_bytes:
            raise ConfigError([Problem(source, f"{info.st_size} bytes", f"a config file of at most {max_bytes} bytes "
                                       f"({max_bytes >> 10} KiB); not read")])
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ConfigError([Problem(source, "<file>", f"a readable YAML file ({exc.strerror or exc})")]) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while we read it
        raise ConfigError([Problem(source, f"more than {max_bytes} bytes", f"a config file of at most {max_bytes} bytes")])
    return data


def load_file(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> Any:
    """Read, decode and parse a YAML file: plain Python values, or a ConfigError with file:line:column."""
    source = str(path)
    return parse_text(decode(read_bytes(Path(path), max_bytes), source), source)


def load_mapping(path: str | os.PathLike, what: str = "a YAML mapping") -> dict:
    """A YAML file whose top level must be a mapping; an empty file (or only comments) is ``{}``."""
    data = load_file(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([Problem(f"{path}:1:1", f"a {type(data).__name__} at the top level", what)])
    return data
