"""The commands, one module each: register, render, batch, serve, live, qc, config, avatars, checkpoints, doctor.
Each parses its options, calls the layer below and prints; cli.py gathers them into `ditto-fast`."""
