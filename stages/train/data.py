"""Training data: a resumable, packed stream over a mixture of text sources (pretraining) and packed
prompt/response examples with loss on the response only (SFT).

Both produce batches ``{"input_ids", "labels", "position_ids"}`` (LongTensor (B, T)) through the same
small interface (:class:`BatchSource`): ``next_batch(n_rows)``, ``state_dict()``, ``load_state_dict()``.
A checkpoint stores the state, so a resumed run continues with exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from stages.core.errors import PipelineError
from stages.train.losses import IGNORE


class BatchSource(Protocol):
    """What the training loop draws batches from. ``fixed_shape``: every batch of a given row count has the same
    (rows, seq_len) shape (the loop's bf16 steps may then follow the load: stages.core.threads.TRAINING)."""

    fixed_shape: bool

    def next_batch(self, n_rows: int) -> dict[str, torch.Tensor]:
        """The next ``n_rows`` rows as ``input_ids``, ``labels``, ``position_ids`` (B, T)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream exactly where it is."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        ...


# ---------------------------------------------------------------------------------------------
# pretraining: a mixture of JSONL text sources


class _SourceReader:
    """Reads the ``"text"`` of each row of a JSONL file from a byte offset, wrapping around at the end.

    The first ``skip_rows`` rows are never read (held out). Resumable: the state is the byte offset and
    the epoch, so resuming a 100 GB source costs one seek.
    """

    def __init__(self, path: str | Path, skip_rows: int = 0) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise PipelineError(f"{self.path}: mixture source not found; run the stage that writes it (dvc repro) or fix pretrain.mixture")
        self._f = open(self.path, "rb")  # noqa: SIM115 (kept open for the stream's life)
        for _ in range(skip_rows):
            if not self._f.readline():
                break
        self.start = self._f.tell()
        self.offset = self.start
        self.epoch = 0
        self.rows = 0
        if self._peek_empty():
            held = f" after the {skip_rows} held-out rows" if skip_rows else ""
            raise PipelineError(f"{self.path}: mixture source has no rows with text{held}; give a non-empty JSONL file")

    def _peek_empty(self) -> bool:
        self._f.seek(self.start)
        for raw in self._f:
            if raw.strip() and self._text(raw, 0):
                self._f.seek(self.start)
                return False
        return True

    def _text(self, raw: bytes, lineno: int) -> str:
        try:
            row = json.loads(raw.decode("utf-8"))
            text = row["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise PipelineError(f"{self.path}: malformed row near byte {self.offset} ({type(e).__name__}: {e}); "
                                "each row must be a JSON object with a string \"text\"") from None
        return text

    def next_text(self) -> str:
        while True:
            self._f.seek(self.offset)
            raw = self._f.readline()
            if not raw:  # end of file: next epoch
                self.offset, self.epoch = self.start, self.epoch + 1
                continue
            self.offset = self._f.tell()
            if not raw.strip():
                continue
            text = self._text(raw, 0)
            if text:
                self.rows += 1
                return text

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "epoch": self.epoch, "rows": self.rows}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.offset, self.epoch, self.rows = int(s["offset"]), int(s["epoch"]), int(s["rows"])


def read_heldout_texts(path: str | Path, n_rows: int) -> list[str]:
    """The ``"text"`` of the first ``n_rows`` rows of a JSONL source (the held-out part)."""
    out: list[str] = []
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: mixture source not found; run the stage that writes it (dvc repro) or fix pretrain.mixture")
    with open(p, "rb") as f:
        for _ in range(n_rows):
            raw = f.readline()
            if not raw:
                break
            if raw.strip():
                text = json.loads(raw.decode("utf-8")).get("text", "")
                if text:
                    out.append(text)
    return out


class PackedMixture:
    """Packed fixed-length sequences drawn from a mixture of sources.

    Each sequence of ``seq_len`` tokens comes from one source, chosen with probability equal to its ratio
    (so token shares follow the ratios). A source's documents are tokenised as ``BOS text EOS`` and
    concatenated; a document may span sequences (no tokens are wasted on padding) and attention runs over
    the whole sequence, across document boundaries, as in standard LM pretraining. Every token is a target.
    """

    fixed_shape = True
    """Every batch is (n_rows, seq_len)."""

    def __init__(self, sources: Sequence[tuple[str | Path, float]], tokenizer: PreTrainedTokenizerBase, seq_len: int,
                 seed: int, skip_first_rows: int = 0) -> None:
        self.readers = [_SourceReader(p, skip_first_rows if i == 0 else 0) for i, (p, _) in enumerate(sources)]
        self.ratios = [float(r) for _, r in sources]
        self.tok = tokenizer
        self.seq_len = seq_len
        self.rng = random.Random(seed)
        self.buffers: list[list[int]] = [[] for _ in sources]
        self.tokens_by_source = [0] * len(sources)

    def _encode(self, text: str) -> list[int]:
        ids = self.tok(text, add_special_tokens=True)["input_ids"]
        return list(ids) + [self.tok.eos_token_id]

    def next_sequence(self) -> list[int]:
        k = self.rng.choices(range(len(self.readers)), weights=self.ratios)[0]
        buf = self.buffers[k]
        while len(buf) < self.seq_len:
            buf.extend(self._encode(self.readers[k].next_text()))
        seq, self.buffers[k] = buf[: self.seq_len], buf[self.seq_len:]
        self.tokens_by_source[k] += self.seq_len
        return seq

    def next_batch(self, n_rows: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor([self.next_sequence() for _ in range(n_rows)], dtype=torch.long)
        pos = torch.arange(self.seq_len, dtype=torch.long).expand(n_rows, -1).clone()
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": pos}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "buffers": [list(b) for b in self.buffers],
                "readers": [r.state_dict() for r in self.readers], "tokens_by_source": list(self.tokens_by_source)}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.rng.setstate(s["rng"])
        self.buffers = [list(b) for b in s["buffers"]]
        for r, rs in zip(self.readers, s["readers"], strict=True):
            r.load_state_dict(rs)
        self.tokens_by_source = list(s["tokens_by_source"])


# ---------------------------------------------------------------------------------------------
# SFT: prompt/response examples


@dataclass(frozen=True)
class Example:
    """One tokenised SFT example: ``labels`` is IGNORE on the prompt and the response ids (ending in EOS) after."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]


def make_example(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> Example:
    """Tokenise prompt (with BOS, exactly as at inference) and response (no special tokens) separately and
    concatenate; append EOS. The loss covers the response tokens and EOS only. The response is text: a
    special token's string in it (an ``</s>`` a TIR program printed into its output block) is split into ordinary
    tokens (``split_special_tokens``), so the only special token of the target is the EOS appended by id."""
    p = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    r = list(tokenizer(response, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    r.append(tokenizer.eos_token_id)
    return Example(tuple(p + r), tuple([IGNORE] * len(p) + r))


def pack_examples(examples: Sequence[Example], seq_len: int, pack: bool = True) -> list[list[int]]:
    """Group example indices into rows of at most ``seq_len`` tokens, in order (greedy: a row is closed when
    the next example does not fit). ``pack=False``: one example per row. Examples longer than ``seq_len``
    must have been removed by the caller."""
    rows: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, ex in enumerate(examples):
        n = len(ex.input_ids)
        if n > seq_len:
            raise ValueError(f"example {i} has {n} tokens > seq_len {seq_len}")
        if cur and (not pack or used + n > seq_len):
            rows.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        rows.append(cur)
    return rows


def collate_rows(rows: Sequence[Sequence[Example]], pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Concatenate each row's examples; ``position_ids`` restart at 0 for every example, which makes the
    model's attention block-diagonal (transformers detects packed sequences from position_ids when no
    attention mask is given): no token attends to another example. Rows are right-padded with ``pad_id`` (label
    IGNORE; the padding forms its own segment) to ``width`` tokens, or to the longest row when ``width`` is None."""
    longest = max(sum(len(e.input_ids) for e in row) for row in rows)
    if width is None:
        width = longest
    elif longest > width:
        raise ValueError(f"a row has {longest} tokens > width {width}")
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        t = 0
        for e in row:
            n = len(e.input_ids)
            ids[b, t:t + n] = torch.tensor(e.input_ids)
            labels[b, t:t + n] = torch.tensor(e.labels)
            pos[b, t:t + n] = torch.arange(n)
            t += n
        if t < width:
            pos[b, t:] = torch.arange(width - t)
    return {"input_ids": ids, "labels": labels, "position_ids": pos}


class PackedExamples:
    """An endless, resumable stream of packed SFT rows: each epoch shuffles the examples (seeded by
    ``seed`` and the epoch), packs them into rows and serves the rows in order.

    Packed rows (``pack``) are padded to ``seq_len``, so every batch of n rows is (n, seq_len) (``fixed_shape``):
    a bf16 step of one shape gives the same bits at 1 and 2 threads, and the loop may then follow the machine's
    load (stages.core.threads.TRAINING). Greedy packing fills a row to within one example of ``seq_len``, so this
    costs a few per cent of tokens (the tiny default: a batch's longest row was 477..509 of 512). One example per
    row (``pack=False``) pads to the batch's longest row instead (padding short examples to ``seq_len`` would
    waste most of the batch), and such steps hold their thread count."""

    def __init__(self, examples: Sequence[Example], seq_len: int, seed: int, pad_id: int, pack: bool = True) -> None:
        if not examples:
            raise PipelineError("sft: no training examples left; check sft.problems and sft.formats")
        self.examples = list(examples)
        self.seq_len, self.seed, self.pad_id, self.pack = seq_len, seed, pad_id, pack
        self.fixed_shape = pack
        self.epoch, self.index = 0, 0
        self._rows = self._epoch_rows(0)

    def _epoch_rows(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        packed = pack_examples([self.examples[i] for i in order], self.seq_len, self.pack)
        return [[order[j] for j in row] for row in packed]

    def rows_per_epoch(self) -> int:
        return len(self._rows)

    def next_batch(self, n_rows: int) -> dict[str, torch.Tensor]:
        rows = []
        for _ in range(n_rows):
            if self.index >= len(self._rows):
                self.epoch, self.index = self.epoch + 1, 0
                self._rows = self._epoch_rows(self.epoch)
            rows.append([self.examples[i] for i in self._rows[self.index]])
            self.index += 1
        return collate_rows(rows, self.pad_id, self.seq_len if self.fixed_shape else None)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.epoch, self.index = int(s["epoch"]), int(s["index"])
        self._rows = self._epoch_rows(self.epoch)


def eval_batches(examples: Sequence[Example], seq_len: int, pad_id: int, rows_per_batch: int) -> list[dict[str, torch.Tensor]]:
    """Fixed evaluation batches: examples packed in file order (same loss as scoring each one alone)."""
    packed = pack_examples(examples, seq_len, True)
    rows = [[examples[i] for i in row] for row in packed]
    return [collate_rows(rows[i:i + rows_per_batch], pad_id) for i in range(0, len(rows), rows_per_batch)]


def text_eval_batches(texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, seq_len: int, max_tokens: int,
                      rows_per_batch: int) -> list[dict[str, torch.Tensor]]:
    """Held-out text as ``BOS text EOS`` documents, each truncated to ``seq_len``, packed without attention
    across documents, until ``max_tokens`` tokens: a fixed set for loss / perplexity before and after."""
    exs: list[Example] = []
    total = 0
    for text in texts:
        ids = (list(tokenizer(text, add_special_tokens=True)["input_ids"]) + [tokenizer.eos_token_id])[:seq_len]
        exs.append(Example(tuple(ids), (IGNORE,) + tuple(ids[1:])))  # BOS is never a target
        total += len(ids)
        if total >= max_tokens:
            break
    return eval_batches(exs, seq_len, tokenizer.pad_token_id, rows_per_batch) if exs else []


LossFn = Callable[[torch.nn.Module], float]
