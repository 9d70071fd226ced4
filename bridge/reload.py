"""Poll mode: watch the repositories and reload what changed, without reload storms.

watchdog reports file events on its own thread. Each event is mapped to the model folder it
touches (the first path component under a repository) and handed to the event loop; events under
ignored names (`__pycache__`, `*.pyc`, editor swap, backup and temp files, see
`repository.is_ignored_name`) and read-only events (open, close-without-write) are dropped here.

Bursts are debounced: nothing happens until the repository has been quiet for `debounce` seconds
(an editor's save, a `git checkout` or a `cp -r` is a burst), or `max_delay` after the first
event if writes never stop. The changed models are then handed to `ModelManager.refresh`, which
reloads a model only if its content digest changed, so a `touch` or a rewrite of the same bytes
does nothing. The watcher does not wait for a refresh to finish before it hands over the next
burst: a reload that hangs (an `initialize` that never returns) holds up only its own model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from model_repository_loader.repository import is_ignored_name

log = logging.getLogger("dynamo_bridge")

# Events that do not change anything on disk; hashing a folder opens its files, so reacting
# to these would make every reload trigger the next one.
_READ_ONLY_EVENTS = frozenset({"opened", "closed_no_write"})


def model_of(path: str | Path, repository: Path) -> str | None:
    """The model folder name an event path belongs to, or None if it should be ignored."""
    try:
        parts = Path(path).relative_to(repository).parts
    except ValueError:
        return None
    if not parts or any(is_ignored_name(part) for part in parts):
        return None
    return parts[0]


class _Handler(FileSystemEventHandler):
    def __init__(self, repository: Path, notify: Callable[[str], None]) -> None:
        self.repository = repository
        self.notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _READ_ONLY_EVENTS:
            return
        paths = [event.src_path, getattr(event, "dest_path", "")]
        for path in paths:
            if not path:
                continue
            name = model_of(path if isinstance(path, str) else path.decode(), self.repository)
            if name is not None:
                self.notify(name)


class RepositoryWatcher:
    """Calls `on_change(names)` on the event loop after each debounced burst of changes."""

    def __init__(
        self,
        repositories: Iterable[Path],
        on_change: Callable[[set[str]], Awaitable[None]],
        debounce: float = 0.5,
        max_delay: float = 5.0,
    ) -> None:
        self.repositories = [Path(r).absolute() for r in repositories]
        self.on_change = on_change
        self.debounce = debounce
        self.max_delay = max(max_delay, debounce)
        self._loop = asyncio.get_running_loop()
        self._observer = Observer()
        self._pending: set[str] = set()
        self._first_event = 0.0
        self._last_event = 0.0
        self._task: asyncio.Task[None] | None = None
        self._changes: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self) -> None:
        for repository in self.repositories:
            handler = _Handler(repository, self._from_thread)
            self._observer.schedule(handler, str(repository), recursive=True)
        self._observer.start()
        log.info(
            "watching %s for model changes (debounce %.2fs)",
            ", ".join(map(str, self.repositories)),
            self.debounce,
        )

    async def stop(self) -> None:
        self._closed = True
        self._observer.stop()
        await self._loop.run_in_executor(None, self._observer.join, 5.0)
        tasks = [t for t in [self._task, *self._changes] if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # -- events ----------------------------------------------------------------------------

    def _from_thread(self, name: str) -> None:
        if not self._closed:
            self._loop.call_soon_threadsafe(self._mark, name)

    def _mark(self, name: str) -> None:
        now = self._loop.time()
        if not self._pending:
            self._first_event = now
        self._pending.add(name)
        self._last_event = now
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Wait for quiet, hand the changed names over, repeat while events keep coming."""
        while self._pending:
            now = self._loop.time()
            quiet_at = self._last_event + self.debounce
            deadline = self._first_event + self.max_delay
            wait = min(quiet_at, deadline) - now
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            names, self._pending = self._pending, set()
            change = asyncio.ensure_future(self._change(names))
            self._changes.add(change)
            change.add_done_callback(self._changes.discard)

    async def _change(self, names: set[str]) -> None:
        try:
            await self.on_change(names)
        except Exception:  # a reload must never stop the watcher
            log.exception("reloading %s failed", ", ".join(sorted(names)))
