"""Live: speech arriving while spoken (sources), the frame clock and session, one ffmpeg muxing the stream (outputs)."""
