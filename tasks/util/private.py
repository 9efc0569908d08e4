"""Owner-only files, by construction. Every defence against another user of the machine goes through
one of four helpers here, so that new code cannot forget one:

- `owner_only()`: the process's umask becomes (at least) 077, so every file and folder zhpipe,
  MLflow, Prefect, pyarrow or PyTorch creates for a project is 0600 or 0700 whatever the user's
  umask; `tighten()` closes what an older project (or a checkout) left open, once, and says so.
- `atomic_path()`: a file written in place of `target` through a temporary name made with O_EXCL
  (mkstemp) beside it, never a predictable name a planted link could stand on; removed when the
  write fails (a full disk leaves nothing behind).
- `open_within()` / `foreign_link()` / `walk_links()`: a file read from a folder without following a
  link, at any hop, that leaves a shared folder or was made by another user; `not_trusted()`: code
  or a model loaded only from where no one else could have written it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

PRIVATE_UMASK = 0o077


def owner_only() -> int:
    """Set the umask to keep group and others out (what the user's umask already masks stays
    masked); the old one."""
    old = os.umask(PRIVATE_UMASK)
    os.umask(old | PRIVATE_UMASK)
    return old


def tighten(*paths: Path, deep: bool = True) -> int:
    """Remove group and other permissions from `paths` and (`deep`) everything under them that this
    user owns, without following links; how many entries were changed."""
    changed = 0
    uid = os.getuid()

    def fix(path: str, st: os.stat_result) -> None:
        nonlocal changed
        if st.st_uid == uid and st.st_mode & 0o077 and not stat.S_ISLNK(st.st_mode):
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
                changed += 1
            except OSError:
                pass

    for top in paths:
        try:
            st = os.lstat(top)
        except OSError:
            continue
        fix(str(top), st)
        if not deep or not stat.S_ISDIR(st.st_mode):
            continue
        for folder, dirs, files in os.walk(top):
            for name in (*dirs, *files):
                path = os.path.join(folder, name)
                try:
                    fix(path, os.lstat(path))
                except OSError:
                    pass
    return changed


def open_to_others(path: Path) -> bool:
    """Whether `path` (not followed when a link) is this user's and grants anything to group or
    others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and bool(st.st_mode & 0o077)


def fresh_temp(target: Path, suffix: str = ".tmp") -> Path:
    """A new empty file beside `target`, at a name no one could guess, made with O_EXCL and mode
    0600 (mkstemp): no link planted at a predictable name is followed."""
    fd, name = tempfile.mkstemp(
        dir=Path(target).parent, prefix=f".{Path(target).name}.", suffix=suffix
    )
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_path(target: Path, suffix: str = ".tmp"):
    """A `fresh_temp` path beside `target` for a writer to fill; renamed over `target` when the
    block ends, removed when it raises (a full disk leaves nothing behind)."""
    import errno

    target = Path(target)
    tmp = fresh_temp(target, suffix)
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        # named as the file being written, not the one being read
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, os.strerror(e.errno), str(target)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(target: Path, data: bytes | str) -> None:
    """`data` written to `target` atomically, through `atomic_path`."""
    with atomic_path(target) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def foreign_link(path: Path, folder: Path) -> str | None:
    """Why `path`, an entry of `folder`, must not be followed: a link made by another user, or, in a
    folder others can write to (a shared drop folder), any link that leads out of it; None for a
    plain entry or a link this user made (a link you made, with `init --link` say, is yours to
    follow)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    if st.st_uid not in (os.getuid(), 0):
        return f"a link made by another user (uid {st.st_uid})"
    try:
        shared = (fst := os.stat(folder)).st_uid != os.getuid() or bool(fst.st_mode & 0o022)
    except OSError:
        shared = True
    target = Path(os.path.realpath(path))
    if shared and not target.is_relative_to(Path(os.path.realpath(folder))):
        return f"a link that leads out of a folder others can write to (to {target})"
    return None


def not_trusted(path: Path) -> str | None:
    """Why code or a model at `path` must not be loaded: someone other than this user (or root)
    could write to it, or to a folder above it (owned by another user, or open to group or others
    without the sticky bit); None when only this user could have put it there. Links are followed,
    each hop checked (`walk_links`)."""
    try:
        real = walk_links(Path(path))
        st = os.stat(real)
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as e:
        return f"{path}: {e.strerror}"
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    for folder in real.parents:
        fst = os.stat(folder)
        if fst.st_uid not in (uid, 0):
            return f"{path}: its folder {folder} belongs to another user (uid {fst.st_uid})"
        if fst.st_mode & 0o022 and not fst.st_mode & stat.S_ISVTX:
            return (
                f"{path}: its folder {folder} can be written by other users (mode "
                f"{stat.S_IMODE(fst.st_mode):o})"
            )
    return None


def walk_links(path: Path, max_hops: int = 40) -> Path:
    """`path`'s real path, its links followed one hop at a time: each must pass `foreign_link` (made
    by this user or root, and not leading out of a folder others can write to), whatever hop it is;
    OSError(ELOOP) names the first that does not. Unlike `os.path.realpath`, a link someone else
    swapped in behind a link of yours is not followed."""
    import errno

    done = Path(os.path.abspath(path).split(os.sep)[0] or os.sep)
    todo = list(Path(os.path.abspath(path)).parts[1:])
    hops = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            done = done.parent
            continue
        step = done / name
        try:
            st = os.lstat(step)
        except OSError:
            return Path(os.path.join(step, *todo))  # missing from here on: nothing more to follow
        if not stat.S_ISLNK(st.st_mode):
            done = step
            continue
        if (why := foreign_link(step, done)) is not None:
            raise OSError(errno.ELOOP, f"not followed: {step} is {why}", str(path))
        hops += 1
        if hops > max_hops:
            raise OSError(errno.ELOOP, "too many levels of links", str(path))
        target = os.readlink(step)
        if os.path.isabs(target):
            done = Path(os.sep)
        todo = [*Path(target).parts[1 if os.path.isabs(target) else 0 :], *todo]
    return done


class NotOurs(Exception):
    """A folder that zhpipe was asked to make a project in, reached through another user's link or
    owned by another user."""


def own_folder(path: Path) -> Path:
    """`path` as a folder of this user's (created 0700 when missing), reached through no link made
    by another user; its real path. `NotOurs` says why not: a project built in a folder someone else
    controls is theirs to rewrite."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    for step in (path, *path.parents):
        try:
            st = os.lstat(step)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.getuid(), 0):
            raise NotOurs(f"{step} is a link made by another user (uid {st.st_uid}); not followed")
    real = Path(os.path.realpath(path))
    real.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise NotOurs(f"{path} is not a folder of yours (owner uid {st.st_uid})")
    return real


def open_within(path: Path, folder: Path | None = None, mode: str = "rb"):
    """`path` opened for reading without following a final link (O_NOFOLLOW), after refusing a
    `foreign_link` of `folder` (its parent by default); OSError(ELOOP) names a final link that is
    not allowed."""
    import errno

    folder = folder if folder is not None else Path(path).parent
    why = foreign_link(Path(path), folder)
    if why is not None:
        raise OSError(errno.ELOOP, f"not followed: {why}", str(path))
    # every hop checked now, as it is read, not only the first one at `init`
    real = walk_links(Path(path))
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    return os.fdopen(fd, mode)
