"""Example-weighted averaging of site results, accumulated as they arrive.

``WeightedMean`` keeps one running sum per parameter, so memory stays at one model whatever the
number of sites. ``add_stream`` folds a result in while it is still arriving, block by block, so
a result is never held whole; ``add`` folds a decoded model in place (its arrays are scaled,
added, then dropped). Sites may send full weights or a diff against the global model they
received; both fold into the same sum:

    mean = (sum_full w_i x_i + sum_diff w_i (g + d_i)) / W
         = (sum_i w_i y_i + W_diff * g) / W        with y_i = x_i or d_i

so a diff costs nothing more than a full result. Integer parameters (e.g. BatchNorm's
``num_batches_tracked``) are averaged in float64 and rounded back. float16 and bfloat16
(``atoll.fl.bfloat16.BF16``) are summed in float32 and rounded back once, in ``result``: the
mean of half-precision results is the float32 mean rounded to their dtype.

The sum is kept in units of the first result's weight (``_unit``): the first result is copied in
as it is, and a later one of the same weight is added as it is, one pass over the data, with no
block scaled first (sites of equal example counts are the common case; a 100 MiB result then
costs one read-add-write instead of a multiply into scratch and then an add). ``result`` scales
once, by unit / total weight, where it divides anyway.

The mean keeps the global model's order of parameters (then the first result's), so the model
sent out next round lists its tensors as the last one did.

With ``spill`` (a folder; app.yaml ``accumulator: disk``) the sum lives in an unlinked file
there instead of in memory, read and written back block by block (pread/pwrite, never mapped,
so it is not in the worker's RSS); with ``reuse_reference`` the global model is kept on disk
too (``atoll.fl.stored``: a diff result reads it back), and ``result`` writes the mean block by
block into a new stored model. From sending the model to holding the next one, the server
worker holds a few MiB, not the model and a float32 sum beside it (three times a bf16 model's
size). The page cache absorbs the files while memory allows; the disk takes them when it does
not.

With ``reuse_reference=True`` the caller hands the global model over: the first result, when it
is full weights, is folded straight into the global model's own buffers (float32/float64), so
the round needs one model's memory, not two. The global model is gone from then on: a later
``diff`` result in the same round cannot be applied and is rejected (that site misses the round).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

from atoll.fl import bfloat16, stored
from atoll.fl.model import Model
from atoll.fl.serde import CHUNK_SIZE, ModelStream, SerdeError
from atoll.spec.errors import AtollError


class ResultRejected(AtollError, ValueError):
    """A site's result that cannot be aggregated; the message says what the site must change."""


class AggregateCorrupted(AtollError, RuntimeError):
    """A streamed result broke off after part of it was folded in: the sum is unusable."""


def _accumulator_dtype(dtype: np.dtype) -> np.dtype:
    if bfloat16.is_bf16(dtype):
        return np.dtype(np.float32)
    if dtype.kind == "f":
        return np.result_type(dtype, np.float32)  # float16 sums in float32
    return np.dtype(np.float64)


class WeightedMean:
    """Running example-weighted mean of models; ``reference`` is the global model sent out."""

    def __init__(
        self, reference: dict[str, np.ndarray] | None = None, *, reuse_reference: bool = False,
        spill: str | os.PathLike[str] | None = None,
    ):
        self._spill = _SpilledSum(spill) if spill is not None else None
        self.reference = reference or None
        self.reuse_reference = reuse_reference  # the caller keeps no other use of `reference`
        self.reference_consumed = False
        self._sum: dict[str, np.ndarray] = {}
        self._spec: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        if self.reference is not None:
            self._spec = {k: (v.shape, v.dtype) for k, v in self.reference.items()}
        if self._spill is not None and self.reference is not None and reuse_reference:
            # the global model goes to disk too (where it is not already), and leaves memory
            self.reference = stored.store(self.reference, self._spill.folder)
        self.total_weight = 0.0
        self.diff_weight = 0.0
        self.count = 0
        self._unit = 1.0  # the sum is kept in units of the first result's weight

    def check(self, model: Model) -> None:
        """Raise ResultRejected if ``model`` cannot be folded into this mean."""
        self._check(model, {name: array.shape for name, array in model.params.items()})

    def _check(self, model: Model, shapes: dict[str, tuple[int, ...]]) -> None:
        if model.num_examples <= 0:
            raise ResultRejected(
                f"reported num_examples={model.num_examples}: send "
                "fl.Model(params=..., num_examples=<training examples used>) so it can be weighted"
            )
        if not shapes:
            raise ResultRejected("sent no params: a train result needs fl.Model(params=...)")
        if model.params_type == "diff" and self.reference_consumed:
            raise ResultRejected(
                "sent params_type='diff' after another site's full weights were folded into the "
                "global model's memory this round, so there is no global model left to apply the "
                "diff to: send the same params_type (full or diff) from every site"
            )
        if model.params_type == "diff" and self.reference is None:
            raise ResultRejected(
                "sent params_type='diff' but the server had no global model to apply it to "
                "(no initial_model): send full params in the first round"
            )
        if self._spec is None:
            return
        expected, got = set(self._spec), set(shapes)
        if expected != got:
            missing, unexpected = sorted(expected - got), sorted(got - expected)
            raise ResultRejected(
                f"params names differ from the global model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        for name, shape in shapes.items():
            if shape != self._spec[name][0]:
                raise ResultRejected(
                    f"params[{name!r}] has shape {list(shape)}, the global model "
                    f"{list(self._spec[name][0])}"
                )

    def add_stream(self, stream: ModelStream, block_bytes: int = CHUNK_SIZE) -> Model:
        """Fold a result in as its data arrives; returns its header (metrics, num_examples...).

        Raises ResultRejected before any data is used; AggregateCorrupted if the stream breaks
        off after part of it was folded in.
        """
        header = stream.model
        self._check(header, {name: shape for name, _, shape in stream.entries})
        if self._spec is None:
            self._spec = {name: (shape, dtype) for name, dtype, shape in stream.entries}
        weight = float(header.num_examples)
        factor = self._factor(weight)
        if self._spill is not None:
            try:
                self._spill.fold(self._spec, stream.blocks(block_bytes), factor, not self.count)
            except SerdeError as exc:
                raise AggregateCorrupted(
                    f"the result broke off while being added ({exc}); this round's average is "
                    "lost") from None
            self._account(header, weight)
            return header
        overwrite = self._take_reference(header)
        for name, (shape, dtype) in self._spec.items():
            if name not in self._sum:
                self._sum[name] = np.zeros(shape, dtype=_accumulator_dtype(dtype))
        scratch: dict[np.dtype, np.ndarray] = {}  # one block of weighted values per dtype
        try:
            for name, start, block in stream.blocks(block_bytes):
                target = self._sum[name].reshape(-1)[start : start + len(block)]
                if bfloat16.is_bf16(block.dtype):  # widened (exactly) into our own buffer
                    wide = scratch.get(block.dtype)
                    if wide is None or len(wide) < len(block):
                        wide = scratch[block.dtype] = np.empty(len(block), np.float32)
                    block = bfloat16.to_float32(block, out=wide[: len(block)])
                    if factor != 1.0 and name not in overwrite:
                        block *= factor
                        np.add(target, block, out=target)
                        continue
                if name in overwrite:  # the global model's buffer: replaced, not added to
                    if factor == 1.0:
                        np.copyto(target, block, casting="unsafe")
                    else:
                        np.multiply(block, factor, out=target, casting="unsafe")
                elif factor == 1.0:  # one pass: read, add, write (numpy casts as it adds)
                    np.add(target, block, out=target, casting="unsafe")
                elif block.dtype == target.dtype:  # the block is read-only (serde.blocks)
                    buffer = scratch.get(block.dtype)
                    if buffer is None or len(buffer) < len(block):
                        buffer = scratch[block.dtype] = np.empty(len(block), block.dtype)
                    target += np.multiply(block, factor, out=buffer[: len(block)])
                else:
                    target += block.astype(target.dtype) * factor
        except SerdeError as exc:
            raise AggregateCorrupted(
                f"the result broke off while being added ({exc}); this round's average is lost"
            ) from None
        self._account(header, weight)
        return header

    def _factor(self, weight: float) -> float:
        """What a result of this weight is multiplied by before it is added: its weight in units
        of the first result's (which fixes the unit)."""
        if not self.count:
            self._unit = weight
        return weight / self._unit

    def _take_reference(self, model: Model) -> set[str]:
        """With reuse_reference, before the first result is folded in: if it is full weights,
        make the global model's buffers the sum (to be overwritten by this result) and return
        their names; otherwise nothing changes."""
        if (
            not self.reuse_reference
            or self.reference is None
            or self.count
            or model.params_type == "diff"
        ):
            return set()
        names = {
            name
            for name, array in self.reference.items()
            if array.dtype == _accumulator_dtype(array.dtype)
            and array.flags.c_contiguous  # reshape(-1) must be a view of the buffer itself
            and array.flags.writeable
        }
        for name in self.reference:  # in the global model's order (the rest follow)
            if name in names:
                self._sum[name] = self.reference[name]
        self.reference, self.reference_consumed = None, True
        return names

    def _account(self, model: Model, weight: float) -> None:
        self.total_weight += weight
        if model.params_type == "diff":
            self.diff_weight += weight
        self.count += 1

    def add(self, model: Model) -> None:
        """Fold one result into the sum; its arrays are reused in place and must not be kept."""
        self.check(model)
        weight = float(model.num_examples)
        factor = self._factor(weight)
        if self._spec is None:  # first result without an initial model fixes names and shapes
            self._spec = {k: (v.shape, v.dtype) for k, v in model.params.items()}
        if self._spill is not None:
            self._spill.fold(self._spec, _blocks(model.params), factor, not self.count)
            model.params.clear()
            self._account(model, weight)
            return
        overwrite = self._take_reference(model)
        for name, array in model.params.items():
            if bfloat16.is_bf16(array.dtype):
                array = bfloat16.to_float32(array)  # our own float32 copy, exact
            if name in overwrite:  # the global model's buffer: replaced, not added to
                np.multiply(array, factor, out=self._sum[name], casting="unsafe")
                continue
            acc_dtype = _accumulator_dtype(self._spec[name][1])
            total = self._sum.get(name)
            if total is not None and factor == 1.0:  # one pass, the result left as it is
                np.add(total, array, out=total, casting="unsafe")
                continue
            if array.dtype != acc_dtype or not array.flags.writeable:
                array = np.array(array, dtype=acc_dtype)  # (np.array keeps 0-d arrays arrays)
            if factor != 1.0:
                np.multiply(array, factor, out=array)
            if total is None:
                self._sum[name] = array
            else:
                np.add(total, array, out=total)
        model.params.clear()  # the arrays now belong to the sum
        self._account(model, weight)

    def _ordered(self) -> list[str]:
        """The sum's names in the global model's order (the first result's without one)."""
        assert self._spec is not None
        return [name for name in self._spec if name in self._sum]

    def result(self) -> dict[str, np.ndarray]:
        """The mean as full params, in the global model's dtypes."""
        if not self.count:
            raise ValueError("no results to average")
        assert self._spec is not None
        if self._spill is not None:
            return self._stored_result(self._spill)
        out: dict[str, np.ndarray] = {}
        for name in self._ordered():
            total = self._sum.pop(name)  # freed as it goes where the dtype changes (bf16)
            out[name] = self._mean_of(total, self.reference[name] if self.diff_weight else None,
                                      self._spec[name][1])
        self._sum = {}
        return out

    def _mean_of(self, total: np.ndarray, reference: np.ndarray | None,
                 dtype: np.dtype) -> np.ndarray:
        """The mean of (part of) a tensor from its sum (changed in place) and, where sites sent
        diffs, the global model's values there."""
        if reference is not None:
            if bfloat16.is_bf16(reference.dtype):
                reference = bfloat16.to_float32(reference)
            total += reference.astype(total.dtype, copy=False) * (self.diff_weight / self._unit)
        total *= self._unit / self.total_weight
        if dtype.kind in "iub":
            np.rint(total, out=total)
        return bfloat16.narrow(total, dtype)  # the one rounding of half precision

    def _stored_result(self, spill: _SpilledSum) -> dict[str, np.ndarray]:
        """The mean written block by block from the sum's file into a stored model: never whole
        in memory (``atoll.fl.stored``)."""
        assert self._spec is not None
        out = stored.StoreWriter(spill.folder, self._spec)
        for name, (shape, dtype) in self._spec.items():
            reference = self.reference[name].reshape(-1) if self.diff_weight else None
            size = math.prod(shape)
            step = max(1, CHUNK_SIZE // _accumulator_dtype(dtype).itemsize)
            for start in range(0, size, step):
                total = spill.read(name, dtype, start, min(step, size - start))
                part = reference[start : start + len(total)] if reference is not None else None
                out.write(name, start, self._mean_of(total, part, dtype).reshape(-1))
            stored.release(reference)
        spill.close()
        return out.finish()


def _blocks(params: dict[str, np.ndarray]) -> Iterator[tuple[str, int, np.ndarray]]:
    """A decoded model as ``ModelStream.blocks`` yields a streamed one."""
    for name, array in params.items():
        flat = array.reshape(-1)
        step = max(1, CHUNK_SIZE // max(1, array.dtype.itemsize))
        for start in range(0, len(flat), step):
            yield name, start, flat[start : start + step]


class _SpilledSum:
    """The sum of ``WeightedMean`` in an unlinked file: each tensor's accumulator at its own
    offset, read into one scratch block, added to and written back (pread/pwrite)."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = str(folder)
        try:
            self._file = tempfile.TemporaryFile(dir=folder, prefix="atoll-sum-")  # gone on close
        except OSError as exc:
            raise self._failed(exc) from None
        self._fd = self._file.fileno()
        self._offsets: dict[str, int] = {}
        self._scratch = np.empty(0, np.float64)

    def _failed(self, exc: OSError) -> AggregateCorrupted:
        return AggregateCorrupted(
            f"the round's sum on disk (accumulator: disk, in {self.folder}) failed: "
            f"{exc.strerror or exc}; free space there, or set accumulator: memory")

    def _layout(self, spec: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        if self._offsets:
            return
        offset = 0
        for name, (shape, dtype) in spec.items():
            self._offsets[name] = offset
            offset += int(np.prod(shape)) * _accumulator_dtype(dtype).itemsize
        os.ftruncate(self._fd, offset)  # reads as zeros (sparse) until written

    def _view(self, n: int, dtype: np.dtype) -> np.ndarray:
        if self._scratch.nbytes < n * dtype.itemsize:
            self._scratch = np.empty(n * dtype.itemsize // 8 + 1, np.float64)
        return self._scratch.view(np.uint8)[: n * dtype.itemsize].view(dtype)

    def fold(self, spec: dict, blocks: Iterable[tuple[str, int, np.ndarray]], factor: float,
             first: bool) -> None:
        try:
            self._fold(spec, blocks, factor, first)
        except OSError as exc:  # a full disk, a file size limit: this round's mean is lost
            raise self._failed(exc) from None

    def _fold(self, spec: dict, blocks: Iterable[tuple[str, int, np.ndarray]], factor: float,
              first: bool) -> None:
        self._layout(spec)
        for name, start, block in blocks:
            acc = _accumulator_dtype(spec[name][1])
            target = self._view(len(block), acc)
            where = self._offsets[name] + start * acc.itemsize
            if bfloat16.is_bf16(block.dtype):
                block = bfloat16.to_float32(block)
            if first:
                np.multiply(block, factor, out=target, casting="unsafe")
            else:
                _read_exact(self._fd, target, where)
                target += block.astype(acc, copy=False) * factor if factor != 1.0 else block
            stored.write_at(self._fd, target, where)

    def read(self, name: str, dtype: np.dtype, start: int, count: int) -> np.ndarray:
        """``count`` sums of tensor ``name`` (of ``dtype``) from element ``start``, in the
        scratch block (valid until the next call)."""
        acc = _accumulator_dtype(dtype)
        out = self._view(count, acc)
        try:
            _read_exact(self._fd, out, self._offsets[name] + start * acc.itemsize)
        except OSError as exc:
            raise self._failed(exc) from None
        return out

    def close(self) -> None:
        self._file.close()


def _read_exact(fd: int, target: np.ndarray, offset: int) -> None:
    view = memoryview(target.view(np.uint8).reshape(-1))
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n <= 0:
            raise OSError(f"the spilled sum ended early at byte {offset}")
        view, offset = view[n:], offset + n


def weighted_metrics(results: Iterable[tuple[dict[str, float], int]]) -> dict[str, float]:
    """Per metric, the mean over the sites that reported it, weighted by their examples (or 1)."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for metrics, num_examples in results:
        w = float(num_examples) if num_examples > 0 else 1.0
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + w * value
            weights[name] = weights.get(name, 0.0) + w
    return {name: sums[name] / weights[name] for name in sums}
