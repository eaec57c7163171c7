"""Media helpers below the stages: ffmpeg pipes, YUV planes, frame rates and timelines, file checks and modes."""
