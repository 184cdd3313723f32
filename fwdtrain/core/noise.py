"""Brownian increments as explicit objects: a seeded source, a user tensor, or a user function.

Every source hands out the increments dW_n, n = 0, 1, 2, ..., of shape (N, m) in
chunks: ``draw(count) -> (count, N, m)``. The stream is a property of the source,
never of how it is chunked.

``BrownianNoise`` defines its stream by a fixed block of ``block`` steps: the
generator is only ever called as ``torch.randn((block, N, m))``, and dW = z sqrt(dt)
elementwise. A chunk of any size is cut from consecutive blocks, so chunk sizes
1, 7, 64 or 10^4 give the same bits. Its position (the generator state before the
block holding step n, and n's offset in that block) is saved by ``state_dict(n)``
and restored by ``BrownianNoise.from_state_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import _checks

BLOCK = 64  # steps per generator call; part of the definition of the default stream


def stream_at(source: Any, position: int, continued: bool) -> Any:
    """A stream of draws cannot jump: ``source`` itself when it is at step ``position``, else a clear error."""
    if source.position != position:
        raise ValueError(
            f"the noise source is at step {source.position} but the run starts at step {position}; "
            + (
                "continue from the Run (or checkpoint) that carries its position"
                if continued
                else "pass a fresh source (or its state_dict position) for a new run"
            )
        )
    return source


class _Indexed:
    """A source indexed by the step count (``TensorNoise``, ``FunctionNoise``): it can be put at any step."""

    kind: str
    position: int

    def copy(self) -> Any:
        raise NotImplementedError

    def seek(self, position: int, continued: bool) -> Any:
        """This source at step ``position`` (row n of a tensor, fn(n) of a function)."""
        self.position = position
        return self

    def rewound(self, saved: dict, dtype: torch.dtype, device: torch.device) -> Any:
        """A copy at the position ``saved`` (its ``state_dict``)."""
        twin = self.copy()
        twin.position = int(saved[self.kind]["position"])
        return twin


class BrownianNoise:
    """Seeded Gaussian increments N(0, dt I_m) for N particles, drawn in blocks of ``block`` steps.

    The object is stateful like a ``torch.Generator`` (``draw`` advances it);
    ``fwdtrain.run`` works on a ``copy()`` and never advances the one you pass.
    """

    kind = "brownian"

    def __init__(
        self,
        shape: tuple[int, ...],
        dt: float,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        block: int = BLOCK,
    ) -> None:
        if len(shape) != 2:
            raise ValueError(f"shape must be (particles, m), got {tuple(shape)}")
        _checks.check_count(shape[0], "shape[0] (particles)")
        _checks.check_count(shape[1], "shape[1] (m)")
        _checks.check_dt(dt)
        _checks.check_count(block, "block")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.shape = (int(shape[0]), int(shape[1]))
        self.dt = float(dt)
        self.seed = seed
        self.dtype = dtype
        self.device = torch.device(device)
        self.block = block
        self.position = 0  # increments handed out so far
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._scale = math.sqrt(self.dt)
        self._buffer: torch.Tensor | None = None  # block number _drawn - 1, scaled by sqrt(dt)
        self._drawn = 0  # blocks drawn from the generator so far
        self._states: dict[int, torch.Tensor] = {}  # block index -> generator state before it (recent blocks)
        self._constants: dict[str, torch.Tensor] | None = None  # state_dict's fixed entries (never written to)

    def _next_block(self) -> torch.Tensor:
        index = self._drawn
        self._states[index] = self._generator.get_state()
        z = torch.randn((self.block, *self.shape), generator=self._generator, dtype=self.dtype, device=self.device)
        self._drawn = index + 1
        return z * self._scale

    def draw(self, count: int) -> torch.Tensor:
        """The next ``count`` increments, shape (count, N, m)."""
        count = _checks.check_count(count, "count")
        first = self.position // self.block
        self._states = {k: v for k, v in self._states.items() if k >= first}  # keep what this draw touches
        pieces = []
        while count > 0:
            index, offset = divmod(self.position, self.block)
            if self._buffer is None or index >= self._drawn:
                self._buffer = self._next_block()
            take = min(count, self.block - offset)
            pieces.append(self._buffer[offset : offset + take])
            self.position += take
            count -= take
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """The stream's position at step ``position`` (default: the current one), as tensors only.

        ``{"brownian": {generator, position, offset, seed, block, shape, dt}}``: the generator
        state before the block holding step ``position`` and the offset in that block.
        ``position`` may be any step from the start of the latest ``draw`` up to
        ``self.position`` (a driver asks for the step its loop has reached).
        """
        position = self.position if position is None else position
        index, offset = divmod(position, self.block)
        if index in self._states:
            state = self._states[index]
        elif index == self._drawn and offset == 0:
            state = self._generator.get_state()
        else:
            raise ValueError(
                f"the noise position {position} is outside the latest draw (steps up to {self.position} are known)"
            )

        if self._constants is None:  # made once: the loop asks at every divergence check
            self._constants = {
                "seed": torch.tensor(self.seed, dtype=torch.int64),
                "block": torch.tensor(self.block, dtype=torch.int64),
                "shape": torch.tensor(list(self.shape), dtype=torch.int64),
                "dt": torch.tensor(self.dt, dtype=torch.float64),
            }
        where = torch.tensor([position, offset], dtype=torch.int64)
        return {self.kind: {"generator": state.clone(), "position": where[0], "offset": where[1], **self._constants}}

    @classmethod
    def from_state_dict(
        cls, data: dict[str, Any], dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> BrownianNoise:
        """Rebuild a source at the saved position; the stream continues bitwise as it would have.

        ``dtype`` and ``device`` are those of the run (the saved state does not repeat them).
        """
        if not isinstance(data, dict) or cls.kind not in data:
            raise ValueError(f"not a BrownianNoise state (expected a dict with key {cls.kind!r}): {data!r:.200}")
        saved = data[cls.kind]
        source = cls(
            tuple(int(n) for n in saved["shape"]),
            float(saved["dt"]),
            seed=int(saved["seed"]),
            dtype=dtype,
            device=device,
            block=int(saved["block"]),
        )
        source._generator.set_state(saved["generator"])
        index = int(saved["position"]) // source.block
        source._drawn = index
        source.position = index * source.block
        if int(saved["offset"]):
            source.draw(int(saved["offset"]))
        return source

    def expect(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> BrownianNoise:
        """Check that the increments are (N, m) = ``shape`` of ``dtype`` on ``device`` (a run's); return self."""
        _check_fits(f"the noise source {self!r}", (-1, *self.shape), self.dtype, self.device, shape, dtype, device)
        return self

    def copy(self) -> BrownianNoise:
        """An independent source at the same position."""
        return BrownianNoise.from_state_dict(self.state_dict(), self.dtype, self.device)

    def seek(self, position: int, continued: bool) -> BrownianNoise:
        """A stream: this source, if it is at step ``position`` (``stream_at``)."""
        return stream_at(self, position, continued)

    def rewound(self, saved: dict, dtype: torch.dtype, device: torch.device) -> BrownianNoise:
        """A copy at the position ``saved`` (its ``state_dict``)."""
        return BrownianNoise.from_state_dict(saved, dtype, device)

    def __repr__(self) -> str:
        return (
            f"BrownianNoise(shape={self.shape}, dt={self.dt}, seed={self.seed}, dtype={self.dtype}, "
            f"block={self.block}, position={self.position})"
        )


class TensorNoise(_Indexed):
    """User increments: row n of ``increments`` (steps, N, m) is dW_n, n counted from the start of training
    ((steps, E, N, m) for an ensemble: ``fwdtrain.ensemble``)."""

    kind = "tensor"

    def __init__(self, increments: torch.Tensor, position: int = 0) -> None:
        if not isinstance(increments, torch.Tensor) or increments.ndim < 3:  # an ensemble's: (steps, E, N, m)
            raise ValueError(
                f"noise must be a (steps, particles, m) tensor of increments, got "
                f"{getattr(increments, 'shape', type(increments).__name__)}"
            )
        if not increments.is_floating_point():
            raise TypeError(
                f"the noise tensor has dtype {increments.dtype}; increments must be floating, of the "
                f"run's dtype (e.g. increments.to(torch.float32))"
            )
        self.increments = increments
        self.shape = tuple(increments.shape[1:])
        self.dtype = increments.dtype
        self.device = increments.device
        self.position = position

    def expect(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> TensorNoise:
        """Check that the increments are (N, m) = ``shape`` of ``dtype`` on ``device`` (a run's); return self."""
        _check_fits("the noise tensor", tuple(self.increments.shape), self.dtype, self.device, shape, dtype, device)
        return self

    def draw(self, count: int) -> torch.Tensor:
        end = self.position + count
        if end > self.increments.shape[0]:
            raise ValueError(
                f"the noise tensor has {self.increments.shape[0]} steps but step {end - 1} was "
                f"requested; supply one row per step of the whole training run"
            )
        out = self.increments[self.position : end]
        self.position = end
        return out

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        position = self.position if position is None else position
        return {self.kind: {"position": torch.tensor(position, dtype=torch.int64)}}

    def copy(self) -> TensorNoise:
        return TensorNoise(self.increments, self.position)


class FunctionNoise(_Indexed):
    """User increments from ``fn(start, count) -> (count, N, m)``: dW_start, ..., dW_{start+count-1}.

    ``fn`` must be a pure function of the step index (so results do not depend
    on the chunk size and a resumed run sees the same increments). Every draw is
    checked (cheaply: shape, dtype, device) against ``expect``'s (N, m), dtype and
    device, or, before ``expect`` is called, against the first draw.
    """

    kind = "function"

    def __init__(self, fn: Callable[[int, int], torch.Tensor], position: int = 0) -> None:
        if not callable(fn):
            raise TypeError(f"noise function must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.position = position
        self.shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self.device: torch.device | None = None

    def expect(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> FunctionNoise:
        """Check every later draw against (N, m) = ``shape``, ``dtype`` and ``device`` (a run's); return self."""
        self.shape, self.dtype, self.device = (int(shape[0]), int(shape[1])), dtype, torch.device(device)
        return self

    def draw(self, count: int) -> torch.Tensor:
        start = self.position
        out = self.fn(start, count)
        steps = f"steps {start} to {start + count - 1} (fn(start={start}, count={count}))"
        if not isinstance(out, torch.Tensor) or out.ndim != 3 or out.shape[0] != count:
            raise ValueError(
                f"noise function returned {getattr(out, 'shape', type(out).__name__)} for {steps}; "
                f"it must return ({count}, particles, m)"
            )
        if not out.is_floating_point():
            raise TypeError(
                f"noise function returned dtype {out.dtype} for {steps}; increments must be floating, "
                f"of the run's dtype"
            )
        if self.shape is None:  # no expectation yet: later draws must match this one
            self.shape, self.dtype, self.device = tuple(out.shape[1:]), out.dtype, out.device
        assert self.shape is not None and self.dtype is not None and self.device is not None
        _check_fits(
            f"noise function for {steps}", tuple(out.shape), out.dtype, out.device, self.shape, self.dtype, self.device
        )
        self.position += count
        return out

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        position = self.position if position is None else position
        return {self.kind: {"position": torch.tensor(position, dtype=torch.int64)}}

    def copy(self) -> FunctionNoise:
        twin = FunctionNoise(self.fn, self.position)
        twin.shape, twin.dtype, twin.device = self.shape, self.dtype, self.device
        return twin


def _check_fits(
    what: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    expected_shape: tuple[int, ...],
    expected_dtype: torch.dtype,
    expected_device: torch.device | str,
) -> None:
    """Raise naming ``what`` unless increments (steps, *shape[1:]) are (steps, N, m) of the expected dtype/device."""
    expected_device = torch.device(expected_device)
    steps = "steps" if shape[0] < 0 else shape[0]
    if tuple(shape[1:]) != tuple(expected_shape):
        raise ValueError(
            f"{what} gave increments of shape ({steps}, {', '.join(map(str, shape[1:]))}) but the run "
            f"expects ({steps}, {expected_shape[0]}, {expected_shape[1]}): one (particles, m) "
            f"increment per step"
        )
    if dtype != expected_dtype:
        raise TypeError(
            f"{what} gave increments of dtype {dtype} but the run's dtype is {expected_dtype}; "
            f"convert them, e.g. .to({expected_dtype})"
        )
    if device.type != expected_device.type or (expected_device.index is not None and device != expected_device):
        raise ValueError(
            f"{what} gave increments on {device} but the run is on {expected_device}; "
            f"move them with .to({str(expected_device)!r})"
        )


Noise = BrownianNoise | TensorNoise | FunctionNoise
NoiseLike = Noise | torch.Tensor | Callable[[int, int], torch.Tensor] | None


def as_noise(noise: NoiseLike) -> Noise | None:
    """A noise object from what a user passes: a source, a (steps, N, m) tensor or a function."""
    if noise is None or isinstance(noise, (BrownianNoise, TensorNoise, FunctionNoise)):
        return noise
    if isinstance(noise, torch.Tensor):
        return TensorNoise(noise)
    if callable(noise):
        return FunctionNoise(noise)
    raise TypeError(
        f"noise must be a BrownianNoise, a (steps, particles, m) tensor or a function "
        f"(start, count) -> increments, got {type(noise).__name__}"
    )


__all__ = ["BLOCK", "BrownianNoise", "FunctionNoise", "Noise", "TensorNoise", "as_noise"]
