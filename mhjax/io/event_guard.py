"""A TensorBoard run's event file that a failing disk cannot turn against the training
(io/tensorboard.py guards every member's writer with it): a failed write reports once and drops
the run's later events, and ``drain`` waits for tensorboardX's writer thread so that a flush
really puts every event logged so far on disk. Reaches into tensorboardX 2.x's writer: that
knowledge lives here only."""

from __future__ import annotations

import threading


class GuardedEvents:
    """A run's event file whose failing write (a full disk) reports once and drops the run's
    later events. Unguarded, tensorboardX's writer thread dies with a traceback, and its queue,
    no longer emptied, blocks the training loop once full; a failed flush raises in the loop."""

    def __init__(self, events, on_error):
        self.events, self.on_error, self.failed = events, on_error, False
        self._reached = threading.Condition()
        self._marks = [0, 0]  # marks sent, marks the writer thread reached

    def _guarded(self, write) -> None:
        if self.failed:
            return
        try:
            write()
        except OSError as exc:
            self.failed = True
            self.on_error(exc)

    def write_event(self, event) -> None:
        if isinstance(event, _Mark):  # every event queued before it is written
            with self._reached:
                self._marks[1] = max(self._marks[1], event.number)
                self._reached.notify_all()
            return
        self._guarded(lambda: self.events.write_event(event))

    def drain(self, event_writer, timeout: float = 60.0) -> None:
        """Wait until ``event_writer``'s thread has written every event queued so far."""
        if event_writer._closed:
            return
        with self._reached:
            self._marks[0] += 1
            number = self._marks[0]
        event_writer._event_queue.put(_Mark(number))
        with self._reached:
            self._reached.wait_for(lambda: self._marks[1] >= number, timeout)

    def flush(self) -> None:
        self._guarded(self.events.flush)

    def close(self) -> None:
        self._guarded(self.events.close)


class _Mark:
    """Queued behind a run's events (it crosses tensorboardX's multiprocessing queue pickled, so
    it is known by its number): reached, everything before it is written (GuardedEvents.drain)."""

    def __init__(self, number: int):
        self.number = number


def guard(writer, on_error) -> None:
    """Route every write of ``writer``'s event file, from its thread and from ours, through
    GuardedEvents (tensorboardX 2.x: FileWriter.event_writer is the EventFileWriter whose
    ``_ev_writer`` the caller and whose ``_worker._record_writer`` the thread write to)."""
    events = writer._get_file_writer().event_writer
    guarded = GuardedEvents(events._ev_writer, on_error)
    events._ev_writer = guarded
    events._worker._record_writer = guarded
    writer._mhjax_guard = guarded


def drain(writer) -> None:
    """Wait until ``writer``'s thread has written every event queued so far (a writer ``guard`` set up;
    any other: nothing to wait for)."""
    guarded = getattr(writer, "_mhjax_guard", None)
    if guarded is not None:
        guarded.drain(writer._get_file_writer().event_writer)
