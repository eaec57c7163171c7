"""Captions: timed text in (SRT, WebVTT, SCC, TTML/DFXP, read with pycaption) or the script timed by CTC alignment,
as cues; EIA-608 paced one byte pair per frame into the deliverable (MXF ANC, A/53 SEI, MOV c608); sidecars;
burn-in. (The captions of a written file are decoded back by delivery/caption_readback.py, for the QC.)"""
