"""Which files are speech to render: the extensions a folder of audio (a batch's --audio-dir, a watch folder) is
read for."""

AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".m4a", ".aac", ".ogg", ".opus")
