"""What the listener heard of an agent's speech: the speech pushed to a session in segments (an answer each, ended by
the agent, or cut by an interruption) and, as the stream goes out, when each segment's playback started and
finished and whether it was interrupted (as LiveKit's avatar protocol reports `playback_finished`), so that an
agent knows what the caller heard. Positions are in samples of the session's source (16 kHz); `frame` is the
index of the stream's frame that carried the event's last sample out."""

from __future__ import annotations

from dataclasses import dataclass

from ditto_fast.media.rates import SPEECH_SAMPLE_RATE


@dataclass
class Segment:
    number: int
    start: int                  # the source index of its first sample
    end: int | None = None      # one past its last, once the agent ended it
    started: bool = False


class Playback:
    """Segments of pushed speech and the playback events of each, in order."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._next = 1

    def pushed(self, start: int, count: int) -> None:
        """Source samples [start, start + count) arrived: they open a segment unless one is open."""
        if count and (not self.segments or self.segments[-1].end is not None):
            self.segments.append(Segment(self._next, start))
            self._next += 1

    def end_segment(self, at: int) -> None:
        """The agent ended its segment (an answer said): it ends at source index `at` (an empty one is dropped)."""
        if self.segments and self.segments[-1].end is None:
            segment = self.segments[-1]
            if at > segment.start:
                segment.end = at
            else:
                self.segments.pop()

    def advance(self, played: int, frame: int = -1) -> list[dict]:
        """Events for playback having reached source index `played` with stream frame `frame`: segments started,
        segments finished whole."""
        events = []
        while self.segments:
            segment = self.segments[0]
            if not segment.started and played > segment.start:
                segment.started = True
                events.append({"event": "playback_started", "segment": segment.number, "frame": frame})
            if segment.end is None or played < segment.end:
                break
            self.segments.pop(0)
            events.append(_finished(segment, segment.end - segment.start, False, frame))
        return events

    def interrupt(self, played: int, frame: int = -1) -> list[dict]:
        """An interruption at source index `played` (stream frame `frame`): every segment not yet finished ends,
        interrupted, with how much of it went out."""
        events = self.advance(played, frame)
        for segment in self.segments:
            heard = max(0, min(played, segment.end if segment.end is not None else played) - segment.start)
            events.append(_finished(segment, heard, True, frame))
        self.segments = []
        return events


def _finished(segment: Segment, samples: int, interrupted: bool, frame: int) -> dict:
    return {"event": "playback_finished", "segment": segment.number,
            "position_s": round(samples / SPEECH_SAMPLE_RATE, 3), "interrupted": interrupted, "frame": frame}
