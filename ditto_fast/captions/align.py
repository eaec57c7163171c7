"""CTC forced alignment: the script's words timed from the speech by the character head of the HuBERT the render
already runs (facebook/hubert-large-ls960-ft is a HubertForCTC: 32 symbols, blank = <pad>, "|" between words).

The transcript becomes the symbol sequence `| W O R D | W O R D |`; the Viterbi pass finds the most likely path
through the CTC trellis (blank, symbol, blank, ... with a symbol repeated only across a blank), over the head's
log-probabilities at 50 Hz; a word lasts from its first letter's first frame to its last letter's last frame.
Characters the head has no symbol for (digits, punctuation) are kept in the word's text but not aligned."""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ditto_fast.core.errors import CheckpointError, UsageError

FRAME_SECONDS = 0.02                # the head's frames: 50 Hz (320 samples at 16 kHz)
BLANK, WORD = "<pad>", "|"
# the letters the published head (facebook/hubert-large-ls960-ft) spells with, as its vocab.json and
# checkpoints/random_hubert.CTC_VOCAB hold them: what the script's length is counted in before HuBERT loads
HEAD_LETTERS = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ'")}


@dataclass(frozen=True)
class TimedWord:
    text: str                       # as the script writes it
    start: float                    # seconds
    end: float


def read_vocab(model_dir: str | Path) -> dict[str, int]:
    """The head's symbols (vocab.json beside the weights); CheckpointError when it is missing or lacks the blank."""
    path = Path(model_dir) / "vocab.json"
    try:
        vocab = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the HuBERT directory needs its vocab.json (re-download it, or "
                              "`ditto-fast checkpoints init-random` again)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable ({e}); re-download the HuBERT directory") from None
    if not isinstance(vocab, dict) or BLANK not in vocab or WORD not in vocab:
        raise CheckpointError(f"{path}: not a CTC character vocabulary (no {BLANK} or {WORD}); re-download it")
    return vocab


def word_symbols(word: str, vocab: dict[str, int]) -> list[int]:
    """The head's symbols for one word: its letters upper-cased, accents dropped, those the head lacks left out."""
    bare = "".join(c for c in unicodedata.normalize("NFKD", word.upper()) if not unicodedata.combining(c))
    return [vocab[c] for c in bare.replace("’", "'") if c in vocab and c not in (BLANK, WORD)]


def frames_needed(tokens: list[int]) -> int:
    """The fewest head frames a CTC path of `tokens` takes: one a token, and a blank between two that repeat."""
    return len(tokens) + sum(a == b for a, b in zip(tokens, tokens[1:]))


def viterbi_path(logp: np.ndarray, tokens: list[int], blank: int) -> np.ndarray:
    """The best CTC path of `tokens` through `logp` [T, V]: for each frame the index of its token (-1: blank).
    ValueError when the frames are too few for the tokens."""
    T, L = logp.shape[0], len(tokens)
    S = 2 * L + 1
    labels = np.full(S, blank, dtype=np.int64)
    labels[1::2] = tokens
    # a token may be reached from two states back (skipping the blank) unless it repeats the token before it
    skip = np.zeros(S, dtype=bool)
    skip[3::2] = np.asarray(tokens[1:]) != np.asarray(tokens[:-1])
    need = frames_needed(tokens)
    if T < need:
        raise ValueError(f"{L} symbols need {need} frames, the speech has {T}")
    neg = -np.inf
    score = np.full(S, neg)
    score[:2] = logp[0, labels[:2]]
    back = np.zeros((T, S), dtype=np.int8)      # 0: stay, 1: from s-1, 2: from s-2
    for t in range(1, T):
        stay = score
        one = np.concatenate(([neg], score[:-1]))
        two = np.where(skip, np.concatenate(([neg, neg], score[:-2])), neg)
        best = np.stack([stay, one, two])       # [3, S]
        choice = np.argmax(best, axis=0)
        score = best[choice, np.arange(S)] + logp[t, labels]
        back[t] = choice
    s = S - 1 if S == 1 or score[S - 1] >= score[S - 2] else S - 2
    path = np.empty(T, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        path[t] = s
        s -= back[t, s]
    return np.where(path % 2 == 1, (path - 1) // 2, -1)


def align_logp(logp: np.ndarray, words: tuple[str, ...] | list[str], vocab: dict[str, int],
               where: str = "the script") -> list[TimedWord]:
    """Each word's time from the head's log-probabilities `logp` [T, V] at 50 Hz. A word with no symbol the head
    knows (a number, say) takes the time between its neighbours. UsageError naming `where` (the script's file) when
    the script is longer than the speech can hold."""
    tokens, owner = [], []
    for i, w in enumerate(words):
        for sym in word_symbols(w, vocab):
            tokens.append(sym)
            owner.append(i)
    if not tokens:
        raise UsageError(f"{where}: the script has no letters to align; give the words the voice reads")
    try:
        path = viterbi_path(logp, tokens, vocab[BLANK])
    except ValueError as e:
        raise UsageError(f"{where}: the script is longer than the speech ({e}); give the words this audio "
                         "reads") from None
    first = np.full(len(words), -1)
    last = np.full(len(words), -1)
    for t, k in enumerate(path):
        if k >= 0:
            w = owner[k]
            first[w] = t if first[w] < 0 else first[w]
            last[w] = t
    out, prev_end = [], 0.0
    for i, w in enumerate(words):
        if first[i] >= 0:
            start, end = first[i] * FRAME_SECONDS, (last[i] + 1) * FRAME_SECONDS
        else:                                   # no symbol: between its neighbours
            later = [first[j] for j in range(i + 1, len(words)) if first[j] >= 0]
            start = prev_end
            end = later[0] * FRAME_SECONDS if later else logp.shape[0] * FRAME_SECONDS
        out.append(TimedWord(w, start, max(end, start)))
        prev_end = out[-1].end
    return out


def align_words(logp: np.ndarray, words: tuple[str, ...], model_dir: str | Path,
                where: str = "the script") -> list[TimedWord]:
    """The script's words timed from the render's HuBERT head output `logp` [T, V] (vocab.json from `model_dir`);
    `where` names the script's file in a refusal."""
    vocab = read_vocab(model_dir)
    if logp.shape[1] != len(vocab):
        raise CheckpointError(f"{Path(model_dir) / 'vocab.json'}: {len(vocab)} symbols, the head gives "
                              f"{logp.shape[1]}; re-download the HuBERT directory")
    return align_logp(logp, words, vocab, where)
