"""What serve's live sessions left open is closed (serve/live/playlists.py): an HLS playlist without #EXT-X-ENDLIST
(its server killed mid-session) gets it at the next start, said in the log; a closed one, a .ts, a playlist still
being written are left alone."""

from __future__ import annotations

import os
import time

from ditto_fast.serve.live.playlists import ENDLIST, WRITTEN_S, OpenPlaylists, close_playlist

OPEN = "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-PLAYLIST-TYPE:EVENT\n#EXTINF:1.000000,\nshow_00000.ts\n"


def aged(path, seconds: float = 60.0):
    """`path` as last written `seconds` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_an_open_playlist_a_killed_server_left_is_closed_at_the_next_start(tmp_path):
    events: list[dict] = []
    records = OpenPlaylists(tmp_path / "home" / "serve" / "live")
    killed = tmp_path / "show.m3u8"
    killed.write_text(OPEN)
    aged(killed)
    finished = tmp_path / "done.m3u8"
    finished.write_text(OPEN + ENDLIST + "\n")
    aged(finished)
    records.add("a1", str(killed))
    records.add("b2", str(finished))
    records.add("c3", str(tmp_path / "gone.m3u8"))      # its session failed before ffmpeg wrote anything
    assert records.recorded() == ["a1", "b2", "c3"]

    OpenPlaylists(tmp_path / "home" / "serve" / "live").recover(events.append)      # the next start
    assert killed.read_text() == OPEN + ENDLIST + "\n"
    assert finished.read_text() == OPEN + ENDLIST + "\n"                    # not twice
    assert not (tmp_path / "gone.m3u8").exists()
    assert records.recorded() == []
    assert [(e["live"], e["event"], e["playlist"]) for e in events] == [("a1", "playlist closed", str(killed))]
    assert ENDLIST in events[0]["why"]


def test_a_playlist_still_being_written_is_looked_at_again(tmp_path):
    """A session that ended while its ffmpeg may still finish: its record stays until the playlist is closed or
    quiet for WRITTEN_S, then it is closed here."""
    records = OpenPlaylists(tmp_path / "live")
    playlist = tmp_path / "now.m3u8"
    playlist.write_text(OPEN.rstrip("\n"))              # written a moment ago, no line end after its last line
    records.add("s1", str(playlist))
    assert records.done("s1") is None and records.recorded() == ["s1"] and ENDLIST not in playlist.read_text()
    aged(playlist, WRITTEN_S + 1)
    assert records.done("s1") is True and records.recorded() == []
    assert playlist.read_text() == OPEN + ENDLIST + "\n"


def test_only_playlists_are_touched(tmp_path):
    not_hls = tmp_path / "notes.m3u8"
    not_hls.write_text("not a playlist\n")
    aged(not_hls)
    assert close_playlist(not_hls) is False and not_hls.read_text() == "not a playlist\n"
    assert close_playlist(tmp_path / "missing.m3u8") is False
