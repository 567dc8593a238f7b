"""Which command wrote a file, and the one check made before any command writes over one.

Every file a command writes carries a mark of who wrote it: a record.json its ``experiment`` (spread, fresh,
inspect; "train" for a training run, whose ``group`` says which command trained it), a page a ``<meta
name="generator">`` naming the command (``page_mark``), act-study's series file the study it opens with. A
command refuses to replace a file that bears another command's mark, or none of ours (``check_out``); a report's
markdown is known by its title, and figures, which carry no mark, are a command's own only beside a marked file
of its own. Pages and reports written before the marks are known by the titles they have always had. Rewriting
one's own files (a rerun, a resumed study) stays allowed: that is how folders resume.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from attnscale.errors import ConfigError
from attnscale.runs import record as rec

__all__ = ["page_mark", "written_by", "holds_ours", "check_folder", "check_out", "check_file", "check_runs_folder"]

OURS_DEPTH = 3  # how deep a folder of ours holds its marked files: reproduce's OUT/<stage>/<run>/record.json

# the heads of the pages written before the generator mark, by the command that wrote them
_OLD_HEADS = {"watch-report": ("<!DOCTYPE html>", "<title>Attention watch: "),
              "report": ("<!DOCTYPE html>", "<title>The score scale in attention: the course")}
_MARKED = re.compile(r'<meta name="generator" content="attnscale ([^"]+)">')
_MARKDOWN_TITLES = {"report": "# The score scale in attention: the course"}  # markdown has no head: its title
_SERIES_HEAD = re.compile(rb'^\{"study":"(act|lr|alarm)",')  # how a study's series file opens
_SERIES_READ = 24  # bytes enough for the longest study name


def page_mark(command: str) -> str:
    """The mark an HTML page written by ``attnscale command`` carries in its head."""
    return f'<meta name="generator" content="attnscale {command}">'


def _head(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8-sig", "replace")
    except OSError:
        return ""


def _series_writer(path: Path) -> str | None:
    """"<name>-study" for a series file a study wrote (gzip'd JSON that opens ``{"study":"<name>",``: act-study,
    lr-study, alarm-study), else None."""
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") as f:
            head = f.read(_SERIES_READ)
    except (OSError, EOFError, zlib.error):
        return None
    m = _SERIES_HEAD.match(head)
    return f"{m.group(1).decode()}-study" if m else None


def written_by(path: Path | str) -> str | None:
    """The attnscale command whose mark ``path`` bears: a record.json's experiment ("train" for a training run),
    a page's generator (or its title, for pages written before the marks), a report's markdown title, the study a
    series file (.gz) names; None for a file without one of ours (a record that cannot be read, a page of someone else's), or no file."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.name == rec.RECORD:
        try:
            return rec.read(path.parent).experiment
        except rec.RecordError:
            return None
    if path.suffix == ".gz":
        return _series_writer(path)
    head = _head(path)
    if path.suffix == ".html":
        marked = _MARKED.search(head)
        old = [c for c, (start, title) in _OLD_HEADS.items() if head.startswith(start) and title in head]
        return marked.group(1) if marked else next(iter(old), None)
    if path.suffix == ".md":
        return next((c for c, title in _MARKDOWN_TITLES.items() if head.startswith(title)), None)
    return None


def check_file(path: Path | str, command: str, option: str = "--out", what: str = "file") -> None:
    """A ``ConfigError`` where ``path`` exists and ``attnscale command`` did not write it (``written_by``):
    one line naming the file, who wrote it where that is known, and the way out."""
    path = Path(path)
    if not path.exists():
        return
    writer = written_by(path)
    if writer != command:
        whose = f"is a {what} attnscale {writer} wrote" if writer else f"is not a {what} attnscale {command} wrote"
        raise ConfigError(f"{option} {str(path)!r} exists and {whose}; give another file, or move that one away first")


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def _visible(folder: Path) -> list[Path]:
    """A folder's entries less hidden ones (a .DS_Store, attnscale's own temporary files and locks)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def holds_ours(folder: Path, depth: int = OURS_DEPTH) -> bool:
    """Whether ``folder`` holds, at most ``depth`` levels down, a file an attnscale command wrote (``written_by``)."""
    entries = _visible(folder)
    if any(p.is_file() and written_by(p) is not None for p in entries):
        return True
    return depth > 1 and any(p.is_dir() and holds_ours(p, depth - 1) for p in entries)


def _holds_a_file(folder: Path) -> bool:
    """Whether ``folder`` holds a file at any depth, hidden ones and those under hidden folders aside: empty
    folders are no one's work (a command's own, made before it was stopped, are such)."""
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if any(not f.startswith(".") for f in files):
            return True
    return False


def check_folder(folder: Path | str, command: str, option: str = "--out") -> None:
    """The one folder rule, before anything is made or written: a command writes into a new or empty folder, or
    one that holds attnscale's files (``written_by``: its own to rewrite or resume, another command's to be refused
    file by file); a folder that holds files and nothing of attnscale's is a ``ConfigError``, since they are the
    user's and a command would write its files among them. Hidden files, and folders without a file, do not count."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    entries = _visible(folder)
    if not _holds_a_file(folder) or holds_ours(folder):
        return
    names = [p.name + ("/" if p.is_dir() else "") for p in entries[:2]]
    held = " and ".join(names) + (f" and {len(entries) - 2} more" if len(entries) > 2 else "")
    raise ConfigError(f"{option} {str(folder)!r} holds {held}, none of them attnscale's, and {command} would write "
                      f"its files among them; give a new or empty folder, e.g. {option} {str(folder / 'attnscale-out')}")


def check_out(folder: Path | str, command: str, files: Sequence[str], option: str = "--out") -> None:
    """A ``ConfigError`` before anything is written where writing ``files`` into ``folder`` would replace a file
    ``attnscale command`` did not write. ``files[0]`` bears the mark (record.json, a page); the others (figures,
    markdown; a name may be a glob such as ``*.png``) are ``command``'s only beside a first file of its own."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    first = folder / files[0]
    if first.exists():
        writer = written_by(first)
        if writer != command:
            whose = f"that attnscale {writer} wrote" if writer else f"that is not one attnscale {command} writes"
            raise ConfigError(f"{option} {str(folder)!r} holds {_a(files[0])} {whose}, which {command} would replace; "
                              "give another folder, or move that one away first")
        return
    for pattern in files[1:]:
        found = sorted(p for p in folder.glob(pattern) if written_by(p) != command)
        if found:
            raise ConfigError(f"{option} {str(folder)!r} holds {found[0].name} but no {files[0]} of attnscale "
                              f"{command}'s, so it is not its folder; give another folder, or move that one away first")


def check_runs_folder(out: Path | str, option: str = "--out") -> None:
    """A ``ConfigError`` where ``out``, where runs are trained into folders of their own (OUT/<run_id>), is itself
    one run's folder, or one that a measurement wrote its record to: its runs would be mixed into it."""
    out = Path(out)
    if (out / rec.RECORD).exists():
        writer = written_by(out / rec.RECORD)
        what = f"the record of an attnscale {writer} run" if writer else f"a {rec.RECORD} that is not a run's"
        raise ConfigError(f"{option} {str(out)!r} holds {what}: runs are trained into folders of their own under "
                          "--out, never beside a record; give another folder (e.g. the one above it)")
